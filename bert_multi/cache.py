"""Where compiled code is kept between runs, so that a framework compiles a model's shapes once, not once a
run: JAX's persistent compilation cache and Inductor's (``torch.compile``), each in a directory of the
user's cache (``$XDG_CACHE_HOME/bert_multi``, else ``~/.cache/bert_multi``).

``BERT_MULTI_CACHE_DIR`` names another directory, or turns the cache off (``none``; the command line's
``--no-cache`` sets it, so the processes a command starts see it too). Each framework's cache holds at
most ``MAX_CACHE_BYTES``, least recently used out first, under the framework's own file lock, so
processes may share one. A cache changes how long a run takes, never what it computes: an entry is the
executable the same program compiles to (its key is the program, the compiler's version and its
options), which is what a cold run would compile.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_VARIABLE = "BERT_MULTI_CACHE_DIR"
OFF = "none"
MAX_CACHE_BYTES = 1 << 30


def cache_root() -> Path | None:
    """The directory holding every framework's cache, or None when caching is off."""
    configured = os.environ.get(CACHE_VARIABLE, "").strip()
    if configured.lower() == OFF:
        return None
    # ``~user`` expanded as a shell does it: one that names no user is left as written (Path.expanduser raises).
    if configured:
        return Path(os.path.expanduser(configured)).absolute()
    return Path(os.path.expanduser(os.environ.get("XDG_CACHE_HOME") or "~/.cache")).absolute() / "bert_multi"


def cache_for(framework: str) -> Path | None:
    """The directory where ``framework`` ("jax", "torch") keeps its compiled code, or None when off."""
    root = cache_root()
    return None if root is None else root / framework


def turn_off() -> None:
    """No cache for this process and those it starts (``--no-cache``)."""
    os.environ[CACHE_VARIABLE] = OFF


def described(directory: object) -> str:
    """A cache directory as a run's report states it."""
    return "off" if not directory else str(directory)
