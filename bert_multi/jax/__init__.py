"""The JAX/Flax backend: d2l's BERT classes in Flax linen and ``build`` for the common interface.

Importing this package imports jax and flax. It lives in the NumPy-2 environment (``.venv-numpy2``):
JAX's optax needs numpy >= 1.24, which MXNet 1.9.1 cannot have.
"""

from ..spec.inputs import get_tokens_and_segments
from .backend import NAME, JaxBERT, build, devices, flax_paths, kernel_eps, precision, to_flax
from .model import (
    AddNorm,
    BERTEncoder,
    BERTModel,
    DotProductAttention,
    MaskLM,
    MultiHeadAttention,
    NextSentencePred,
    NextSentencePredMLP,
    PositionalEncoding,
    PositionWiseFFN,
    TransformerEncoderBlock,
    masked_softmax,
)

__all__ = [
    "NAME",
    "JaxBERT",
    "build",
    "devices",
    "flax_paths",
    "kernel_eps",
    "precision",
    "to_flax",
    "AddNorm",
    "BERTEncoder",
    "BERTModel",
    "DotProductAttention",
    "MaskLM",
    "MultiHeadAttention",
    "NextSentencePred",
    "NextSentencePredMLP",
    "PositionalEncoding",
    "PositionWiseFFN",
    "TransformerEncoderBlock",
    "get_tokens_and_segments",
    "masked_softmax",
]
