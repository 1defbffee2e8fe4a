"""bert_multi: d2l.ai's BERT in PyTorch, MXNet/Gluon and JAX/Flax behind one interface, checked against NumPy.

Importing this package imports no deep-learning framework; ``load_backend(name)`` imports a backend's
framework when asked.
"""

from .backend.contract import BUILD_OPTIONS, Backend, BackendModel, BERTOutput, intermediate_names
from .backend.registry import (
    BackendStatus,
    LoadedBackend,
    backend_names,
    backends,
    frameworks,
    load_backend,
    register_backend,
    unregister_backend,
)
from .engine.compare import Comparison, Tolerance, compare_arrays, tolerance_for
from .engine.conform import run_conformance
from .engine.results import Report, RunError, Target, assert_conforms, compare_outputs
from .errors import (
    BackendContractError,
    BackendUnavailable,
    CannotRunHere,
    InputError,
    UsageError,
    UserCodeError,
    WeightsError,
)
from .files.checkpoints import (
    Checkpoint,
    CheckpointInfo,
    convert,
    from_huggingface,
    inspect_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from .spec.config import CONFIGS, BERTConfig
from .spec.inputs import ModelInputs, check_inputs, get_tokens_and_segments, valid_lens_from_attention_mask
from .spec.schema import init_weights, param_shapes, random_weights, validate_weights
from .spec.weight_file import load_weights, save_weights
from .verify.mapping import MappingError
from .verify.masking import MaskingReport, verify_masking
from .verify.session import VerifyReport, verify

__version__ = "0.1.0"

__all__ = [
    "BUILD_OPTIONS",
    "Backend",
    "BackendModel",
    "BERTOutput",
    "intermediate_names",
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
    "RunError",
    "Target",
    "assert_conforms",
    "compare_outputs",
    "run_conformance",
    "MappingError",
    "MaskingReport",
    "VerifyReport",
    "verify",
    "verify_masking",
    "BackendContractError",
    "BackendUnavailable",
    "CannotRunHere",
    "InputError",
    "UsageError",
    "UserCodeError",
    "WeightsError",
    "ModelInputs",
    "check_inputs",
    "get_tokens_and_segments",
    "valid_lens_from_attention_mask",
    "BackendStatus",
    "LoadedBackend",
    "backend_names",
    "backends",
    "frameworks",
    "load_backend",
    "register_backend",
    "unregister_backend",
    "init_weights",
    "param_shapes",
    "random_weights",
    "validate_weights",
    "load_weights",
    "save_weights",
]
