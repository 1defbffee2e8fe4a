"""d2l 0.16-0.17's BERT as PyTorch classes with those releases' constructor signatures (every input
width spelled out: ``key_size``, ``norm_shape``, ``ffn_num_input``, ``hid_in_features`` ...):
``from bert_multi.torch import d2l_0_17 as d2l``.

The preset is d2l 1.0's, and so are the state_dict names. One difference, kept on purpose: these
releases added ``pos_embedding.data`` to the embeddings, so the positional embedding never trained;
``BERTEncoder`` and ``BERTModel`` here do the same (``train_positions=False``). The classes are
bert_multi's own (``model.py``); ``bert_multi.generations`` translates the old arguments.
"""

from ..spec import generations
from ..spec.inputs import get_tokens_and_segments
from . import model

PRESET = "d2l"

masked_softmax = model.masked_softmax
DotProductAttention = model.DotProductAttention
PositionalEncoding = model.PositionalEncoding
NextSentencePred = model.NextSentencePred  # NextSentencePred(num_inputs)


class MultiHeadAttention(generations.SizedMultiHeadAttention, model.MultiHeadAttention):
    preset = PRESET


class EncoderBlock(generations.SizedEncoderBlock, model.TransformerEncoderBlock):
    preset = PRESET


class BERTEncoder(generations.SizedBERTEncoder, model.BERTEncoder):
    preset = PRESET
    # Framework difference: d2l 0.16-0.17's PyTorch code read pos_embedding.data (no gradient); its MXNet
    # code trained the positions.
    train_positions = False


class MaskLM(generations.SizedMaskLM, model.MaskLM):
    preset = PRESET


class BERTModel(generations.SizedBERTModel, model.BERTModel):
    preset = PRESET
    train_positions = False


__all__ = [
    "BERTEncoder",
    "BERTModel",
    "DotProductAttention",
    "EncoderBlock",
    "MaskLM",
    "MultiHeadAttention",
    "NextSentencePred",
    "PositionalEncoding",
    "get_tokens_and_segments",
    "masked_softmax",
]
