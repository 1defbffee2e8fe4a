"""Pretraining, framework-free: d2l's data pipeline (``data``), the loop on any backend that can train
(``loop``) and the whole training state in one file (``state``). Each framework backend's
``Pretrainer`` computes the loss, the gradients and the optimizer steps."""

from ..spec.loss import MLM_NORMALIZATIONS, LossValues
from .data import (
    RESERVED_TOKENS,
    BatchTotals,
    PretrainingData,
    Vocab,
    builtin_corpus,
    check_batch,
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
    check_trainable,
    check_training_options,
    free_address,
    load_run,
    relay_steps,
    run_pretraining,
    save_run,
)
from .state import STATE_FILE, TrainingState, load_training_state, save_training_state

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
    "OPTIMIZERS",
    "TrainingRun",
    "check_trainable",
    "check_training_options",
    "free_address",
    "load_run",
    "relay_steps",
    "run_pretraining",
    "save_run",
    "MLM_NORMALIZATIONS",
    "LossValues",
    "STATE_FILE",
    "TrainingState",
    "load_training_state",
    "save_training_state",
]
