"""The MXNet/Gluon backend: d2l 1.0's BERT classes and ``build`` for the common interface.

Importing this package imports mxnet and switches it to NumPy mode (``npx.set_np()``), as d2l does.
"""

import os
import sys

import numpy

from ..errors import BackendUnavailable

# MXNet 1.9.1, the last release, uses np.bool, which NumPy 1.24 removed: say so instead of crashing.
if tuple(int(part) for part in numpy.__version__.split(".")[:2]) >= (1, 24):
    raise BackendUnavailable(
        f"backend 'mxnet' needs numpy<1.24 (MXNet 1.9.1 uses np.bool, removed in NumPy 1.24), but numpy "
        f"{numpy.__version__} is installed; install it in its own environment: pip install 'bert_multi[mxnet]'"
    )

# Without OMP_NUM_THREADS, MXNet starts with half the cores (it assumes hyper-threading) and sets that
# for every OpenMP user in the process, torch included. Use all of them unless the user chose.
if "mxnet" not in sys.modules:
    os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))

from ..spec.inputs import get_tokens_and_segments  # noqa: E402
from .backend import (  # noqa: E402  (after the checks above)
    LAYER_NORM_EPS,
    NAME,
    NAME_RULES,
    MXNetBERT,
    build,
    devices,
    gemm,
    kernel_eps,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
    synchronize,
)
from .model import (  # noqa: E402
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
from .pretrain import Pretrainer, end_worker, join_data_parallel, pretraining_loss, train_data_parallel  # noqa: E402
from .user import USER_MODELS, wrap_user_model  # noqa: E402

__all__ = [
    "LAYER_NORM_EPS",
    "kernel_eps",
    "NAME",
    "NAME_RULES",
    "MXNetBERT",
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
