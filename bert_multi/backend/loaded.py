"""A loaded backend (``LoadedBackend``): the module or object a registration loaded, with each optional
capability of the contract (``bert_multi.backend.Backend``) looked up once, and its default where the
backend has none. ``bert_multi.backend.registry`` makes them."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import BackendContractError, CannotRunHere, UsageError
from ..spec.config import BERTConfig
from ..spec.schema import normalize_dtype
from .contract import (
    BUILD_OPTIONS,
    FUSED_ON_GPU,
    ROLES,
    BackendModel,
    CaseGroups,
    check_mixed_precision_option,
    parse_device,
)
from .registrations import Registration


class LoadedBackend:
    """A loaded backend: its optional capabilities looked up here, once each, with their defaults (the
    contract: ``bert_multi.backend.Backend``). Any other attribute is the backend module's own
    (``load_backend("torch").BERTModel``)."""

    def __init__(self, registration: Registration, target: Any) -> None:
        self.registration = registration
        self.module = target
        name = getattr(target, "NAME", None)
        if name != registration.name:
            raise BackendContractError(
                f"backend {registration.name!r} ({registration.where}) is refused: its NAME is {name!r}; "
                "an entry point's name must be the backend's NAME"
            )
        if not callable(getattr(target, "build", None)):
            raise BackendContractError(f"backend {registration.name!r} ({registration.where}) has no build function")
        self.name: str = name
        self.role: str = getattr(target, "ROLE", registration.role)
        if self.role not in ROLES:
            raise BackendContractError(f"backend {name!r} states ROLE {self.role!r}; expected one of {list(ROLES)}")
        self.label: str = registration.label or getattr(target, "LABEL", name)
        self._parameters, self._any_option = _build_parameters(target.build)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.module, attribute)

    @property
    def elsewhere(self) -> str | None:
        """The Python that runs it, when that is another environment's (``bert_multi.backend.remote``);
        None when it runs in this process."""
        return getattr(self.module, "ENVIRONMENT", None)

    @property
    def where(self) -> str:
        """Where it comes from, for people; a backend run in another environment names its Python."""
        python = self.elsewhere
        return self.registration.where if python is None else f"{self.registration.where} in {shown(python)}"

    def __repr__(self) -> str:
        return f"<backend {self.name!r} ({self.registration.where})>"

    # --- building ----------------------------------------------------------------------------------

    def build(
        self,
        config: BERTConfig,
        weights: Mapping[str, np.ndarray],
        device: str = "cpu",
        dtype: object = None,
        **options: Any,
    ) -> BackendModel:
        """The backend's model, after the checks every backend shares: the options are standard (or the
        backend's own), the device is a device, and the backend computes ``config`` there (else
        ``CannotRunHere``). What comes back must be a ``BackendModel`` (else ``BackendContractError``).
        ``dtype`` None is the backend's own default (float32 for the frameworks, float64 for the oracle)."""
        taken = self._options(options)
        parse_device(device)
        if "mixed_precision" in taken:
            check_mixed_precision_option(taken["mixed_precision"], normalize_dtype(dtype or "float32"))
        reason = self.supports(config, device)
        if reason is not None:
            raise CannotRunHere(f"backend {self.name!r}: {reason}")
        if dtype is not None:
            taken["dtype"] = dtype
        model = self.module.build(config, weights, device=device, **taken)
        if not isinstance(model, BackendModel):
            raise BackendContractError(
                f"backend {self.name!r}'s build returned {type(model).__name__}, not a bert_multi BackendModel"
            )
        if not getattr(model, "backend", None):  # the model of a backend that did not name it
            model.backend = self.name
        return model

    @property
    def prepares(self) -> bool:
        """Whether it compiles ahead what a run will ask for (the contract's ``prepare``)."""
        return callable(getattr(self.module, "prepare", None))

    def prepare(self, config: BERTConfig, groups: CaseGroups, dtypes: list[str], device: str) -> None:
        """Compile ahead what a run will ask for (the contract's ``prepare``); nothing for a backend that
        does not compile, or does not say how."""
        if self.prepares:
            self.module.prepare(config, groups, dtypes, device)

    def fused_on(self, device: str) -> dict[str, object]:
        """The build options that make its attention fused where speed is wanted: ``FUSED_ON_GPU`` on a GPU
        where its build takes them, else none."""
        fused = parse_device(device).kind == "gpu" and all(self.takes(option) for option in FUSED_ON_GPU)
        return dict(FUSED_ON_GPU) if fused else {}

    def takes(self, option: str) -> bool:
        """Whether its ``build`` takes ``option`` (a backend without ``compile`` runs as it always does)."""
        return option in self._parameters or (self._any_option and option in BUILD_OPTIONS)

    def _options(self, options: dict[str, Any]) -> dict[str, Any]:
        """The options to pass on: those its build takes; standard ones it does not take are dropped where
        they may be ignored or are their default, and otherwise refused."""
        taken = {}
        for name, value in options.items():
            if name in self._parameters or (self._any_option and name in BUILD_OPTIONS):
                taken[name] = value
            elif name not in BUILD_OPTIONS:
                own = sorted(self._parameters - set(BUILD_OPTIONS))
                raise UsageError(
                    f"unknown build option {name!r}: the standard ones are {list(BUILD_OPTIONS)}"
                    + (f", and backend {self.name!r} also takes {own}" if own else "")
                )
            elif not (BUILD_OPTIONS[name].may_ignore or value == BUILD_OPTIONS[name].default):
                raise CannotRunHere(f"backend {self.name!r} has no {name!r} option, so cannot give {name}={value!r}")
        return taken

    def supports(self, config: BERTConfig, device: str = "cpu") -> str | None:
        """Why this backend cannot compute ``config`` on ``device``, or None."""
        own = getattr(self.module, "supports", None)
        return None if own is None else own(config, device)

    def devices(self) -> list[str]:
        """The devices this backend can use here."""
        own = getattr(self.module, "devices", None)
        return ["cpu"] if own is None else list(own())

    def kernel_eps(self, eps: float) -> float:
        """The LayerNorm epsilon its kernels really use when asked for ``eps``."""
        own = getattr(self.module, "kernel_eps", None)
        return eps if own is None else float(own(eps))

    @property
    def name_rules(self) -> list[tuple[str, str]]:
        """(regex, replacement) rules from canonical parameter names to this backend's own."""
        return list(getattr(self.module, "NAME_RULES", []))

    # --- checkpoints ------------------------------------------------------------------------------------

    def save_checkpoint(self, path: object, config: BERTConfig, weights: dict[str, np.ndarray]) -> None:
        """Write ``weights`` as its framework's own checkpoint file."""
        self._required("save_checkpoint", "writes no checkpoint format of its own")(path, config, weights)

    def read_checkpoint(self, path: object, key: str | None = None) -> tuple[dict, dict, list[str]]:
        """Its framework's own checkpoint file under the file's names: arrays, their dtypes, notes."""
        return self._required("read_checkpoint", "reads no checkpoint format of its own")(path, key)

    # --- training -------------------------------------------------------------------------------------

    @property
    def can_train(self) -> bool:
        return getattr(self.module, "Pretrainer", None) is not None

    @property
    def mixed_precisions(self) -> tuple[str, ...]:
        """The mixed precisions its ``Pretrainer`` trains in (its ``MIXED_PRECISION``; none if it cannot train)."""
        return tuple(getattr(getattr(self.module, "Pretrainer", None), "MIXED_PRECISION", ()))

    def trainer(self, model: BackendModel, **options: Any) -> Any:
        """Its ``Pretrainer`` of ``model`` (see ``bert_multi.pretraining``)."""
        return self._required("Pretrainer", "cannot train (it has no Pretrainer)")(model, **options)

    def train_data_parallel(self, workers: int, threads_per_worker: int = 1, **arguments: Any) -> Any:
        """Pretraining in ``workers`` processes of ``threads_per_worker`` threads on its framework's own
        engine (``bert_multi.pretraining.run_pretraining``'s arguments)."""
        train = self._required("train_data_parallel", "has no data-parallel workers")
        return train(workers, threads_per_worker, **arguments)

    def join_data_parallel(self, **arguments: Any) -> Any:
        """Be one worker of a data-parallel run launched from outside."""
        return self._required("join_data_parallel", "has no data-parallel workers")(**arguments)

    def end_worker(self, code: int) -> int:
        """How a data-parallel worker ends once its work is written (default: return ``code``)."""
        own = getattr(self.module, "end_worker", None)
        return code if own is None else own(code)

    # --- users' own models ----------------------------------------------------------------------------

    def wraps(self, model: object) -> int | None:
        """How far up ``model``'s class hierarchy the nearest class this backend wraps is (0: its own
        class), or None: the backend's ``USER_MODELS`` names them as module.qualname."""
        wrapped = getattr(self.module, "USER_MODELS", ())
        for depth, cls in enumerate(type(model).__mro__):
            if f"{cls.__module__}.{cls.__qualname__}" in wrapped:
                return depth
        return None

    def wrap_user_model(self, model: object, dtype: str, device: str, example: Any, copied: bool) -> Any:
        """``model`` as a ``bert_multi.verify.subject.Subject`` at ``dtype`` on ``device``."""
        wrap = self._required("wrap_user_model", "wraps no model of a user's")
        return wrap(model, dtype, device, example, copied)

    # --- timing -------------------------------------------------------------------------------------

    @property
    def bench_variants(self) -> dict[str, dict[str, Any]]:
        """What ``bench`` times beside its plain build: each variant's name and the build options that make
        it (its ``BENCH_VARIANTS``; default none)."""
        return dict(getattr(self.module, "BENCH_VARIANTS", {}))

    def gemm(self, dtype: str, m: int, k: int, n: int) -> Callable[[], object]:
        """One (m, k) x (k, n) product as its dense layers compute one, ready to call and time."""
        own = getattr(self.module, "gemm", None)
        if own is not None:
            return own(dtype, m, k, n)
        a, w = np.ones((m, k), dtype=dtype), np.ones((n, k), dtype=dtype)
        return lambda: a @ w.T

    def synchronize(self) -> None:
        """Wait until its queued work is done (a framework that returns early must say so here)."""
        own = getattr(self.module, "synchronize", None)
        if own is not None:
            own()

    def _required(self, attribute: str, missing: str) -> Callable[..., Any]:
        own = getattr(self.module, attribute, None)
        if own is None:
            raise UsageError(f"backend {self.name!r} {missing}")
        return own


def shown(path: str) -> str:
    """A path relative to the working directory where it lies under it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if relative.startswith("..") else relative


def _build_parameters(build: Callable[..., Any]) -> tuple[set[str], bool]:
    """The option names ``build`` takes beyond config, weights, device and dtype, and whether it takes
    any keyword (``**options``)."""
    try:
        parameters = inspect.signature(build).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature: let it take what it is given
        return set(), True
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named - {"config", "weights", "device", "dtype"}, any(p.kind == p.VAR_KEYWORD for p in parameters)
