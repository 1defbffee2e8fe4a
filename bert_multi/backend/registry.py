"""The backend registry: which backends exist, and loading them when asked (``LoadedBackend``, in
``bert_multi.backend.loaded``, gives each its capabilities with their defaults).

The project's own backends register here, in code, so that everything works from a source tree with
nothing installed (``PYTHONPATH=. python3 -m bert_multi.cli ...``). Other packages add theirs through
the entry-point group ``bert_multi.backends``: the entry's name is the backend's name, its value a
module or object satisfying ``bert_multi.backend.Backend``. In a ``pyproject.toml``::

    [project.entry-points."bert_multi.backends"]
    mybackend = "my_package.bert_backend"

An entry that shadows a built-in name, or a name another entry already took, is refused (``refused()``
says why); one whose ``NAME`` differs from its entry's name is refused when loaded. One that fails to
import is unavailable, with the reason, and never breaks the others. Code can register a backend too
(``register_backend``). Nothing is imported until a backend is asked for.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from .. import waiting
from ..errors import BackendContractError, BackendUnavailable, CannotRunHere, UsageError
from . import remote
from .contract import ROLES
from .loaded import LoadedBackend, shown
from .registrations import BUILTIN, Registration

ENTRY_POINT_GROUP = "bert_multi.backends"


class _Registry:
    """Every registration, discovered once: the built-ins, then installed entry points, then code's."""

    def __init__(self) -> None:
        self.registrations: dict[str, Registration] | None = None
        self.refused: list[str] = []
        self.loaded: dict[str, LoadedBackend] = {}

    def all(self) -> dict[str, Registration]:
        if self.registrations is None:
            self.registrations = {registration.name: registration for registration in BUILTIN}
            self.refused = []
            for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                self._add_entry_point(entry)
        return self.registrations

    def _add_entry_point(self, entry: importlib.metadata.EntryPoint) -> None:
        assert self.registrations is not None
        dist = getattr(getattr(entry, "dist", None), "name", None)
        where = f"entry point {entry.name} = {entry.value} (from {dist or 'an unknown distribution'})"
        if entry.name in self.registrations:
            taken = self.registrations[entry.name]
            owner = "bert_multi's own backend" if taken.origin == "bert_multi" else taken.where
            self.refused.append(f"{where}: refused, the name {entry.name!r} is taken by {owner}")
            return
        install = f"pip install {dist}" if dist else ""
        self.registrations[entry.name] = Registration(entry.name, entry.load, where, "entry point", install=install)


_REGISTRY = _Registry()


def refresh() -> None:
    """Forget what was discovered and loaded, so that entry points installed since are found."""
    global _REGISTRY
    _REGISTRY = _Registry()


def registrations() -> dict[str, Registration]:
    """Every registered backend by name, in order: the built-ins first."""
    return dict(_REGISTRY.all())


def refused() -> list[str]:
    """Why each refused entry point was refused."""
    _REGISTRY.all()
    return list(_REGISTRY.refused)


def share_the_process() -> None:
    """Set, where they are not set already, the environment variables each registered backend's framework
    reads when it starts (``Registration.process_defaults``), so that the frameworks share one process and
    its GPU: for commands and test runs that use several, before any of them starts."""
    for registration in registrations().values():
        for name, value in registration.process_defaults:
            os.environ.setdefault(name, value)


def register_backend(backend: object, *, role: str | None = None, label: str | None = None) -> LoadedBackend:
    """Register a module or object satisfying the backend contract under its ``NAME``, for this process;
    the registered backend. A built-in or already registered name is refused with a ``ValueError``."""
    name = getattr(backend, "NAME", None)
    if not isinstance(name, str) or not name:
        raise UsageError(f"{backend!r} has no NAME: a backend needs a NAME and a build (bert_multi.backend.Backend)")
    known = _REGISTRY.all()
    if name in known:
        raise UsageError(f"a backend named {name!r} is already registered ({known[name].where})")
    where = f"registered in code ({getattr(backend, '__name__', type(backend).__name__)})"
    role = role or str(getattr(backend, "ROLE", "framework"))
    known[name] = Registration(name, lambda: backend, where, "code", role, label or "")
    try:
        return load_backend(name)
    except Exception:
        del known[name]  # a backend that breaks the contract is not left registered
        raise


def unregister_backend(name: str) -> None:
    """Undo ``register_backend``; the built-ins and installed entry points stay."""
    known = _REGISTRY.all()
    if name not in known or known[name].origin != "code":
        raise UsageError(f"{name!r} was not registered in code")
    del known[name]
    _REGISTRY.loaded.pop(name, None)


def check_names(names: list[str] | tuple[str, ...]) -> None:
    """A ``ValueError`` naming the known backends, and the nearest, for any name that is not registered."""
    known = list(_REGISTRY.all())
    for name in names:
        if name not in known:
            near = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise UsageError(f"unknown backend {name!r}{hint}: expected one of {known}")


def load_backend(name: str) -> LoadedBackend:
    """The backend called ``name``, loaded: ``BackendUnavailable`` says what to install if its framework is
    missing, ``BackendContractError`` that it breaks the contract, ``ValueError`` that no such name exists."""
    check_names([name])
    if name not in _REGISTRY.loaded:
        registration = _REGISTRY.all()[name]
        try:
            target = registration.load()
        except ImportError as error:  # BackendUnavailable included: the framework cannot run in this environment
            if isinstance(error, BackendUnavailable):
                unavailable = error
            else:
                install = f"; to install it: {registration.install}" if registration.install else ""
                unavailable = BackendUnavailable(f"backend {name!r} is unavailable ({error}){install}")
            if registration.origin != "bert_multi":
                raise unavailable from error
            target = remote.load_elsewhere(name, registration.environment, unavailable)
        except CannotRunHere:
            raise
        except Exception as error:  # noqa: BLE001 - an entry point's import may raise anything: a broken backend
            raise BackendContractError(
                f"backend {name!r} ({registration.where}) failed to import: {type(error).__name__}: {error}"
            ) from error
        _REGISTRY.loaded[name] = LoadedBackend(registration, target)
    return _REGISTRY.loaded[name]


def load_backends(
    names: Iterable[str], then: Callable[[str, LoadedBackend], object] | None = None
) -> dict[str, LoadedBackend | Exception]:
    """Each of ``names`` loaded, or the exception its loading raised (``load_backend``'s). Those whose
    framework is not installed here, and that another environment's worker will run, are loaded first on
    a thread of their own: their workers start while this process imports its own frameworks. ``then``
    is called with each backend as soon as it is loaded, on the thread that loaded it, while the others
    load (so that a worker's first work need not wait for this process's imports)."""
    names = list(dict.fromkeys(names))
    check_names(names)
    registrations = _REGISTRY.all()
    elsewhere = [name for name in names if name not in _REGISTRY.loaded and _installed_elsewhere(registrations[name])]
    loaded: dict[str, LoadedBackend | Exception] = {}

    def load(name: str) -> None:
        try:
            loaded[name] = backend = load_backend(name)
        except Exception as error:  # noqa: BLE001 - the caller reports it, as it would load_backend's
            loaded[name] = error
            return
        if then is not None:
            then(name, backend)

    def load_elsewhere() -> None:
        for name in elsewhere:
            load(name)

    starting = threading.Thread(target=load_elsewhere, daemon=True)
    starting.start()
    try:
        for name in names:
            if name not in elsewhere:
                load(name)
    finally:  # even on Ctrl-C: a worker started is one this process knows, and stops as it exits
        waiting.join(starting)
    return {name: loaded[name] for name in names}


def processes_for(names: Iterable[str]) -> int:
    """How many processes run these backends, known without importing a framework: this one, and a
    worker for each other environment that runs one of them."""
    registrations = _REGISTRY.all()
    return 1 + len({registrations[name].environment for name in names if _installed_elsewhere(registrations[name])})


def _installed_elsewhere(registration: Registration) -> bool:
    """Whether loading a backend will go to its environment's worker (``remote.load_elsewhere``): it has
    one, and its framework's first package cannot be imported here (asked without importing anything)."""
    if not (registration.environment and registration.packages):
        return False
    return importlib.util.find_spec(registration.packages[0]) is None


def interpreter_of(name: str) -> str | None:
    """The Python that runs backend ``name``'s framework, known without loading it: this one, where its
    framework can be imported here, else the one its environment's worker would use (None if none)."""
    registration = _REGISTRY.all()[name]
    if not _installed_elsewhere(registration):
        return sys.executable
    python = remote.interpreter(name, registration.environment)
    return None if python is None else str(python)


def label_of(name: str) -> str:
    """How people call the backend ``name`` ("PyTorch"), known without loading it: its registration's
    label, else its name."""
    return _REGISTRY.all()[name].label or name


class BackendStatus(NamedTuple):
    available: bool
    reason: str | None  # why it is unavailable, with what to install
    role: str = "framework"
    label: str = ""
    where: str = ""


def backends() -> dict[str, BackendStatus]:
    """Every registered backend, with whether it loads here and, if not, why. Never raises: a backend
    that breaks the contract is listed as unavailable, saying so."""
    status: dict[str, BackendStatus] = {}
    loaded = load_backends(_REGISTRY.all())
    for name, registration in _REGISTRY.all().items():
        backend = loaded[name]
        if isinstance(backend, (CannotRunHere, BackendContractError)):
            status[name] = BackendStatus(False, str(backend), registration.role, label_of(name), registration.where)
        elif isinstance(backend, Exception):
            raise backend
        else:
            status[name] = BackendStatus(True, None, backend.role, backend.label, backend.where)
    return status


def not_in_process(name: str) -> str | None:
    """Why backend ``name``'s framework cannot be used in this process (its classes, its checkpoints,
    users' models of it), or None: it is unavailable, or runs in another environment's worker."""
    try:
        elsewhere = load_backend(name).elsewhere
    except (CannotRunHere, BackendContractError) as error:  # as backends() reports it unavailable
        return str(error)
    return None if elsewhere is None else f"backend {name!r} runs in another environment here ({shown(elsewhere)})"


def backend_names(role: str | None = None) -> list[str]:
    """Registered names, in order; with ``role``, those of that role. Backends registered from outside
    state their own ``ROLE`` (default "framework"), so they are loaded to ask; one that cannot load is
    taken at its word of registration."""
    if role is not None and role not in ROLES:
        raise UsageError(f"unknown role {role!r}: expected one of {list(ROLES)}")
    names = []
    for name, registration in _REGISTRY.all().items():
        own = registration.role
        if role is not None and registration.origin != "bert_multi":
            try:
                own = load_backend(name).role
            except (CannotRunHere, BackendContractError):
                pass
        if role is None or own == role:
            names.append(name)
    return names


def wrapper_for(model: object) -> LoadedBackend | None:
    """The backend that wraps ``model`` (a user's own model object) for ``bert-multi verify``: of those
    declaring one of its classes in ``USER_MODELS``, the one nearest its own class (transformers' before
    PyTorch's for a transformers model, which is also an ``nn.Module``); None if no backend does."""
    found = [(depth, backend) for backend in imported_backends() if (depth := backend.wraps(model)) is not None]
    return min(found, key=lambda item: item[0])[1] if found else None


def imported_backends() -> list[LoadedBackend]:
    """The backends, loaded, of the frameworks this process has imported (a user's model file imports its
    own): nothing of another framework's, so that verifying a torch model imports no MXNet. Loaded before a
    user's code computes, a backend's settings (JAX's compilation cache) hold for what it compiles too."""
    loaded = []
    for name, registration in _REGISTRY.all().items():
        if registration.packages and registration.packages[0] not in sys.modules:
            continue
        try:
            loaded.append(load_backend(name))
        except (CannotRunHere, BackendContractError):
            continue
    return loaded


def environment_for(package: str) -> tuple[str, Path] | None:
    """The registered environment (its directory's name, its Python) that provides ``package``, where this
    process cannot import it: a user's module that imports it runs there. None if no backend's does."""
    for name, registration in _REGISTRY.all().items():
        if package in registration.packages and registration.environment:
            python = remote.interpreter(name, registration.environment)
            if python is not None:
                return registration.environment, python
    return None


def frameworks() -> list[str]:
    """The framework backends: what ``conform`` checks, ``pretrain`` trains and ``bench`` times by default."""
    return backend_names("framework")
