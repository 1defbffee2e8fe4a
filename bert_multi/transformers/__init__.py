"""HuggingFace transformers' ``BertForPreTraining`` / ``BertModel`` as one more backend: an independent
implementation of the original BERT, compared like any other (eager attention, TF32 off unless asked for).

It computes the ``bert`` preset and its variants (GELU or ReLU, any LayerNorm eps, tied or own decoder);
for a d2l generation ``supports`` says why not, and a conformance run reports a SKIP row. valid_lens
become transformers' additive attention mask, (B, 1, T, T), so a length per query works too.
"""

from .backend import BENCH_VARIANTS, NAME, TransformersBERT, build, devices, gemm, kernel_eps, supports, synchronize
from .user import USER_MODELS, D2LView, wrap_user_model

__all__ = [
    "BENCH_VARIANTS",
    "NAME",
    "TransformersBERT",
    "build",
    "devices",
    "gemm",
    "kernel_eps",
    "supports",
    "synchronize",
    "USER_MODELS",
    "D2LView",
    "wrap_user_model",
]
