"""The PyTorch backend: d2l 1.0's BERT classes and ``build`` for the common interface.

Importing this package imports torch.
"""

from ..spec.inputs import get_tokens_and_segments
from .backend import (
    LAYER_NORM_EPS,
    NAME,
    NAME_RULES,
    TorchBERT,
    build,
    devices,
    gemm,
    kernel_eps,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
    synchronize,
    tf32_enabled,
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
    "LAYER_NORM_EPS",
    "kernel_eps",
    "NAME",
    "NAME_RULES",
    "TorchBERT",
    "tf32_enabled",
    "build",
    "devices",
    "gemm",
    "load_checkpoint",
    "read_checkpoint",
    "save_checkpoint",
    "synchronize",
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
