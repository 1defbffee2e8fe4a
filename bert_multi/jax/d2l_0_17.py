"""d2l 0.16-0.17's BERT in Flax with those releases' constructor signatures as their MXNet code has them
(``num_layers``, input widths inferred, as Flax infers them): ``from bert_multi.jax import d2l_0_17 as d2l``.

The preset is d2l 1.0's, and so are the parameter names. The positions train, as in d2l's MXNet code of
those releases (its PyTorch code read ``pos_embedding.data``: ``bert_multi.torch.d2l_0_17`` keeps that).
The modules are bert_multi's own (``model.py``); ``bert_multi.generations`` translates the old arguments.
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
