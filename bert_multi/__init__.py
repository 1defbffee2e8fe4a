"""bert_multi: d2l.ai's BERT in PyTorch and MXNet/Gluon behind one interface, checked against NumPy.

Importing this package imports no deep-learning framework; ``load_backend("torch")`` or
``load_backend("mxnet")`` does, when asked.
"""

from .backend import (
    BACKEND_NAMES,
    BackendModel,
    BackendStatus,
    BERTOutput,
    backends,
    intermediate_names,
    load_backend,
)
from .checkpoints import (
    Checkpoint,
    CheckpointInfo,
    convert,
    from_huggingface,
    inspect_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from .compare import Comparison, Tolerance, compare_arrays, tolerance_for
from .config import CONFIGS, BERTConfig
from .conform import Report, Target, assert_conforms, compare_outputs, run_conformance
from .errors import BackendUnavailable, InputError, WeightsError
from .inputs import ModelInputs, check_inputs, get_tokens_and_segments, valid_lens_from_attention_mask
from .schema import init_weights, param_shapes, random_weights, validate_weights
from .weights import load_weights, save_weights

__version__ = "0.1.0"

__all__ = [
    "BACKEND_NAMES",
    "BackendModel",
    "BackendStatus",
    "BERTOutput",
    "backends",
    "intermediate_names",
    "load_backend",
    "Checkpoint",
    "CheckpointInfo",
    "convert",
    "from_huggingface",
    "inspect_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
    "Comparison",
    "Tolerance",
    "compare_arrays",
    "tolerance_for",
    "CONFIGS",
    "BERTConfig",
    "Report",
    "Target",
    "assert_conforms",
    "compare_outputs",
    "run_conformance",
    "BackendUnavailable",
    "InputError",
    "WeightsError",
    "ModelInputs",
    "check_inputs",
    "get_tokens_and_segments",
    "valid_lens_from_attention_mask",
    "init_weights",
    "param_shapes",
    "random_weights",
    "validate_weights",
    "load_weights",
    "save_weights",
]
