"""What is known of a backend before it is loaded (its ``Registration``), and the project's own backends
(``BUILTIN``), registered in code so that everything works from a source tree with nothing installed."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Registration:
    """A backend's name and what is known of it before it is loaded."""

    name: str
    load: Callable[[], Any] = field(repr=False, compare=False)  # the module or object satisfying the contract
    where: str  # where it comes from, for people: a module path, or an entry point and its distribution
    origin: str  # who registered it: "bert_multi" (its own), "entry point" or "code"
    role: str = "framework"  # a key of ROLES; a backend registered from outside may state its own ROLE
    label: str = ""  # how people call it (default: its name)
    install: str = ""  # what to install when it cannot load
    # The environment (a directory beside the source tree) where the project installs its framework: run
    # there by a worker process when it cannot load here (``bert_multi.backend.remote``).
    environment: str = ""
    # Environment variables its framework reads when it starts, with the values that let it share a
    # process and its GPU with the others (``share_the_process``), as (name, value) pairs.
    process_defaults: tuple[tuple[str, str], ...] = ()
    # The packages its framework is installed as, the one whose classes users' models are first: a user's
    # model of that framework cannot exist in a process that has not imported it (so looking for its
    # wrapper need not load this backend), and a user's module that cannot import one of them is run in
    # this backend's environment (``verify``).
    packages: tuple[str, ...] = ()


def _own(name: str, path: str, role: str, label: str, **known: Any) -> Registration:
    load = lambda: importlib.import_module(path)  # noqa: E731
    return Registration(name, load, path, "bert_multi", role, label, **known)


# The project's own backends, in the order reports list them: one entry each.
BUILTIN = (
    _own("numpy", "bert_multi.backend.oracle", "oracle", "NumPy"),
    _own(
        "torch",
        "bert_multi.torch",
        "framework",
        "PyTorch",
        install="pip install 'bert_multi[torch]' (torch==2.13.0 is the tested CPU build)",
        packages=("torch",),
    ),
    _own(
        "mxnet",
        "bert_multi.mxnet",
        "framework",
        "MXNet/Gluon",
        install="pip install 'bert_multi[mxnet]' (mxnet==1.9.1, which needs numpy<1.24)",
        environment=".venv",
        packages=("mxnet",),
    ),
    _own(
        "jax",
        "bert_multi.jax",
        "framework",
        "JAX/Flax",
        install="make .venv-numpy2/.installed (jax==0.10.2, flax==0.12.8, optax==0.2.8; they need numpy>=1.24)",
        environment=".venv-numpy2",
        # JAX takes three quarters of a GPU's memory at its first use unless told to allocate as it goes.
        process_defaults=(("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),),
        packages=("flax", "jax", "jaxlib", "optax"),
    ),
    _own(
        "transformers",
        "bert_multi.transformers",
        "reference",
        "transformers",
        install="pip install 'bert_multi[torch,reference]' (transformers)",
        packages=("transformers",),
    ),
)
