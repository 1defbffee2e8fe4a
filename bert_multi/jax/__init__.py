"""The JAX/Flax backend: d2l's BERT classes in Flax linen and ``build`` for the common interface.

Importing this package imports jax and flax. It lives in the NumPy-2 environment (``.venv-numpy2``):
JAX's optax needs numpy >= 1.24, which MXNet 1.9.1 cannot have.
"""

from ..spec.inputs import get_tokens_and_segments
from .backend import (
    NAME,
    NAME_RULES,
    JaxBERT,
    build,
    devices,
    flax_paths,
    gemm,
    kernel_eps,
    load_checkpoint,
    precision,
    prepare,
    read_checkpoint,
    save_checkpoint,
    synchronize,
    to_flax,
)
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
from .pretrain import Pretrainer, end_worker, join_data_parallel, pretraining_loss, train_data_parallel
from .user import USER_MODELS, wrap_user_model

__all__ = [
    "NAME",
    "NAME_RULES",
    "JaxBERT",
    "build",
    "devices",
    "flax_paths",
    "gemm",
    "kernel_eps",
    "load_checkpoint",
    "precision",
    "prepare",
    "read_checkpoint",
    "save_checkpoint",
    "synchronize",
    "to_flax",
    "Pretrainer",
    "end_worker",
    "join_data_parallel",
    "pretraining_loss",
    "train_data_parallel",
    "USER_MODELS",
    "wrap_user_model",
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
