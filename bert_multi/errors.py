"""The project's exceptions. Each message says what is wrong and what was expected."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path


class UsageError(ValueError):
    """What was asked is wrong wherever it runs: an unknown name, options that cannot go together, a
    config that cannot exist. The command line shows it as one line; any other exception is a bug."""


class InputError(ValueError):
    """A model input (tokens, segments, valid_lens, pred_positions) breaks the model's contract."""


class WeightsError(ValueError):
    """A weight dict or weight file does not match the canonical schema, or is corrupt."""


class StatementsMissing(WeightsError):
    """A checkpoint can be read only once what it cannot tell is stated: every missing statement in one
    message, spelled as Python arguments (``str``) or as command-line flags (``for_command_line``)."""

    def __init__(self, path: object, missing: dict[str, tuple[str, str, str]]) -> None:
        self.path, self.missing = path, missing  # what -> (argument, flag, why the file cannot tell)
        super().__init__(self._message(0))

    def for_command_line(self) -> str:
        return self._message(1)

    def _message(self, spelling: int) -> str:
        statements = " and ".join(spellings[spelling] for spellings in self.missing.values())
        reasons = "; ".join(f"{what}: {spellings[2]}" for what, spellings in self.missing.items())
        return f"{self.path}: state {statements} to read it. {reasons}."


class CannotRunHere(Exception):
    """A backend cannot do what was asked on this machine, and nothing is wrong with it: its framework is
    missing, the device asked for is not here, or it does not compute the model asked for (transformers
    and a d2l generation). A conformance run reports this as a SKIP with the message; any other
    exception from a backend is a failure."""


class BackendUnavailable(CannotRunHere, ImportError):
    """A backend's framework is not installed here, or cannot run with what is installed."""


class BackendContractError(RuntimeError):
    """A backend breaks the backend contract (``bert_multi.backend.Backend``): a bug in the backend, never
    a reason to skip it."""


class WorkerFailed(RuntimeError):
    """A worker process failed: one of a data-parallel run raised or died (the others were stopped), or
    the worker running a backend in another environment died, hung or sent a damaged reply."""

    @classmethod
    def died(cls, index: int, workers: int, how: str) -> WorkerFailed:
        """Worker ``index`` of ``workers`` ended by ``how`` ("signal SIGKILL", "exit code 1")."""
        return cls(f"worker {index} of {workers} died ({how}); the others were stopped")


class UserCodeError(Exception):
    """The user's own code raised: shown with the frames of their code, since that is where to look."""

    def __init__(self, what: str, error: BaseException) -> None:
        self.error: BaseException | None = error  # None when carried from another process (``carried``)
        every = traceback.extract_tb(error.__traceback__)
        frames = [frame for frame in every if not _ours_or_a_library(frame.filename)]
        if not frames:  # none of theirs: the library's that raised, never bert_multi's (what their code returned)
            frames = [frame for frame in every if not Path(frame.filename).resolve().is_relative_to(_PACKAGE)]
        shown = "".join(traceback.format_list(frames))
        message = "".join(traceback.format_exception_only(type(error), error)).strip()
        where = f"\nTraceback (your code):\n{shown.rstrip()}" if shown.strip() else ""
        super().__init__(f"{what} raised {message}{where}")


MAX_CARRIED_CHARACTERS = 4000  # of an error's text carried from another process: a paragraph, not a file


def carried(kind: str, message: str) -> Exception | None:
    """The project's exception named ``kind`` as another process raised it with ``message`` (a worker of
    another environment reports the class's name and the text), or None if ``kind`` is not one of them.
    The text is kept as the error says it, within bounds: one line (a user's error keeps the lines of its
    frames) of at most ``MAX_CARRIED_CHARACTERS``. What does not travel as text is left out (a user's
    original exception, the statements a ``StatementsMissing`` lists, which becomes the ``WeightsError`` it
    is)."""
    own = globals().get(kind)
    if not (isinstance(own, type) and issubclass(own, Exception) and own.__module__ == __name__):
        return None
    if own is StatementsMissing:
        own = WeightsError
    error = own.__new__(own)
    BaseException.__init__(error, bounded_text(message, lines=issubclass(own, UserCodeError)))
    if isinstance(error, UserCodeError):
        error.error = None
    return error


def bounded_text(text: str, lines: bool = False) -> str:
    """Text another process sent, as it may be shown: its lines joined by " / " unless ``lines`` are kept,
    at most ``MAX_CARRIED_CHARACTERS``, saying how much was left out."""
    if not lines:
        text = " / ".join(line for line in text.splitlines() if line.strip())
    if len(text) > MAX_CARRIED_CHARACTERS:
        text = f"{text[:MAX_CARRIED_CHARACTERS]} ... ({len(text) - MAX_CARRIED_CHARACTERS} more characters)"
    return text


_PACKAGE = Path(__file__).resolve().parent


def _ours_or_a_library(filename: str) -> bool:
    """Whether a frame is bert_multi's or an installed library's (the framework), not the user's."""
    path = Path(filename).resolve()
    libraries = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix)}
    generated = filename == "<string>" or filename.startswith("<frozen")  # code a library compiled at run time
    return path.is_relative_to(_PACKAGE) or any(path.is_relative_to(lib) for lib in libraries) or generated
