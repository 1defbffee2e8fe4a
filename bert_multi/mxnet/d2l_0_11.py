"""d2l 0.11's BERT (its chapter's code) as Gluon classes with that release's constructor signatures:
``from bert_multi.mxnet import d2l_0_11 as d2l``.

The preset "d2l-0.11": fixed sinusoidal positions (then dropout), attention without biases, valid_lens
tiled over the heads (d2l's bug, reproduced), and a next-sentence head that pools <cls> itself. The
classes are bert_multi's own (``model.py``); ``bert_multi.generations`` translates the old arguments.
"""

from ..spec import generations
from ..spec.inputs import get_tokens_and_segments
from . import model

PRESET = "d2l-0.11"

masked_softmax = model.masked_softmax
DotProductAttention = model.DotProductAttention
PositionalEncoding = model.PositionalEncoding
MaskLM = model.MaskLM
NextSentencePred = model.NextSentencePredMLP  # NextSentencePred(num_hiddens): reads <cls>, then its MLP


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
