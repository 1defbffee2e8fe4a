"""d2l 0.16-0.17's BERT as Gluon classes with those releases' constructor signatures (``num_layers``,
input widths inferred): ``from bert_multi.mxnet import d2l_0_17 as d2l``.

The preset is d2l 1.0's, and so are the parameter names. The classes are bert_multi's own
(``model.py``); ``bert_multi.generations`` translates the old arguments.
"""

from ..spec import generations
from ..spec.inputs import get_tokens_and_segments
from . import model

PRESET = "d2l"

masked_softmax = model.masked_softmax
DotProductAttention = model.DotProductAttention
PositionalEncoding = model.PositionalEncoding
MaskLM = model.MaskLM  # MaskLM(vocab_size, num_hiddens): the input width is inferred
NextSentencePred = model.NextSentencePred  # NextSentencePred()


class MultiHeadAttention(generations.GluonStyleMultiHeadAttention, model.MultiHeadAttention):
    preset = PRESET


class EncoderBlock(generations.GluonStyleEncoderBlock, model.TransformerEncoderBlock):
    preset = PRESET


class BERTEncoder(generations.GluonStyleBERTEncoder, model.BERTEncoder):
    preset = PRESET
    # Framework difference: d2l 0.16-0.17's MXNet code trained the positions; its PyTorch code read
    # pos_embedding.data (no gradient).
    train_positions = True


class BERTModel(generations.GluonStyleBERTModel, model.BERTModel):
    preset = PRESET
    train_positions = True


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
