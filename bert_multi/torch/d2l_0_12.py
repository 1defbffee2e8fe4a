"""d2l 0.12-0.15's BERT (MXNet-only in d2l) as PyTorch classes with those releases' constructor
signatures: ``from bert_multi.torch import d2l_0_12 as d2l``. This PyTorch twin is how a d2l 0.x
MXNet user moves to PyTorch.

The preset "d2l-0.12": d2l 1.0's model except that valid_lens are tiled over the heads, d2l's bug
until 0.15 (reproduced: it is what checkpoints of those releases were trained with). The classes are
bert_multi's own (``model.py``); ``bert_multi.generations`` translates the old arguments.
"""

from ..spec import generations
from ..spec.inputs import get_tokens_and_segments
from . import model

PRESET = "d2l-0.12"

masked_softmax = model.masked_softmax
DotProductAttention = model.DotProductAttention
PositionalEncoding = model.PositionalEncoding
MaskLM = model.MaskLM
NextSentencePred = model.NextSentencePred


class MultiHeadAttention(generations.GluonStyleMultiHeadAttention, model.MultiHeadAttention):
    preset = PRESET


class EncoderBlock(generations.GluonStyleEncoderBlock, model.TransformerEncoderBlock):
    preset = PRESET


class BERTEncoder(generations.GluonStyleBERTEncoder, model.BERTEncoder):
    preset = PRESET


class BERTModel(generations.GluonStyleBERTModel, model.BERTModel):
    preset = PRESET


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
