"""Backends: the contract every backend meets (``contract``, whose names are also this package's), the
registry that finds them (``registry``), and the NumPy oracle (``oracle``), the executable
specification every other backend is held to. The framework backends live beside this package
(``bert_multi.torch``, ``bert_multi.mxnet``) with the transformers reference (``bert_multi.transformers``).
"""

from .contract import (
    BUILD_OPTIONS,
    ROLES,
    Backend,
    BackendModel,
    BERTOutput,
    Device,
    Option,
    framework_module,
    framework_names,
    intermediate_names,
    intermediate_sources,
    parse_device,
    prepare_weights,
    read_only,
    shareable,
)

__all__ = [
    "BUILD_OPTIONS",
    "ROLES",
    "Backend",
    "BackendModel",
    "BERTOutput",
    "Device",
    "Option",
    "framework_module",
    "framework_names",
    "intermediate_names",
    "intermediate_sources",
    "parse_device",
    "prepare_weights",
    "read_only",
    "shareable",
]
