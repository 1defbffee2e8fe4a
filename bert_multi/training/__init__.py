"""Pretraining, framework-free: d2l's data pipeline (``data``), the loop on any backend that can train
(``loop``), and what every framework's ``Pretrainer`` shares (``trainer``): each framework fills in its
loss, backward pass and optimizer step. The whole training state in one file is the spec's
(``bert_multi.spec.training_state``): a checkpoint reader reads it too."""

from ..backend.contract import MIXED_PRECISIONS
from ..spec.loss import MLM_NORMALIZATIONS, BatchTotals, LossValues, check_batch
from ..spec.training_state import STATE_FILE, TrainingState, load_training_state, save_training_state
from .data import (
    RESERVED_TOKENS,
    PretrainingData,
    Vocab,
    builtin_corpus,
    mlm_example,
    nsp_examples,
    num_mlm_predictions,
    paragraphs_from_lines,
    read_wiki,
    replace_mlm_tokens,
    shard,
    tokenize,
)
from .loop import (
    ADAM_EPSILON_STYLES,
    OPTIMIZERS,
    TrainingRun,
    check_mixed_precision,
    check_trainable,
    check_training_options,
    free_address,
    handout,
    load_run,
    relay_steps,
    run_pretraining,
    save_run,
    watch_workers,
    worker_environment,
)
from .trainer import Trainer

__all__ = [
    "RESERVED_TOKENS",
    "BatchTotals",
    "PretrainingData",
    "Vocab",
    "builtin_corpus",
    "check_batch",
    "mlm_example",
    "nsp_examples",
    "num_mlm_predictions",
    "paragraphs_from_lines",
    "read_wiki",
    "replace_mlm_tokens",
    "shard",
    "tokenize",
    "ADAM_EPSILON_STYLES",
    "MIXED_PRECISIONS",
    "OPTIMIZERS",
    "TrainingRun",
    "check_mixed_precision",
    "check_trainable",
    "check_training_options",
    "free_address",
    "handout",
    "load_run",
    "relay_steps",
    "run_pretraining",
    "save_run",
    "watch_workers",
    "worker_environment",
    "MLM_NORMALIZATIONS",
    "LossValues",
    "STATE_FILE",
    "TrainingState",
    "load_training_state",
    "save_training_state",
    "Trainer",
]
