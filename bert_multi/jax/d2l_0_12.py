"""d2l 0.12-0.15's BERT in Flax with those releases' constructor signatures, as the Gluon classes take
them: ``from bert_multi.jax import d2l_0_12 as d2l``.

The preset "d2l-0.12": d2l 1.0's model except that valid_lens are tiled over the heads, d2l's bug
until 0.15 (reproduced: it is what checkpoints of those releases were trained with). The modules are
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

# Framework difference: a Flax module is a dataclass whose fields are its constructor, so it takes no
# mixin's __init__; each old signature is a function that builds the 1.0 module from the translated arguments.
MultiHeadAttention = generations.constructor(generations.GluonStyleMultiHeadAttention, model.MultiHeadAttention, PRESET)
EncoderBlock = generations.constructor(generations.GluonStyleEncoderBlock, model.TransformerEncoderBlock, PRESET)
BERTEncoder = generations.constructor(generations.GluonStyleBERTEncoder, model.BERTEncoder, PRESET)
BERTModel = generations.constructor(generations.GluonStyleBERTModel, model.BERTModel, PRESET)

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
