"""The project's exceptions. Each message says what is wrong and what was expected."""

from __future__ import annotations


class InputError(ValueError):
    """A model input (tokens, segments, valid_lens, pred_positions) breaks the model's contract."""


class WeightsError(ValueError):
    """A weight dict or weight file does not match the canonical schema, or is corrupt."""


class BackendUnavailable(ImportError):
    """A backend's framework is not installed here, or cannot run with what is installed."""


class WorkerFailed(RuntimeError):
    """A worker of a data-parallel run raised or died; the other workers were stopped."""

    @classmethod
    def died(cls, index: int, workers: int, how: str) -> WorkerFailed:
        """Worker ``index`` of ``workers`` ended by ``how`` ("signal SIGKILL", "exit code 1")."""
        return cls(f"worker {index} of {workers} died ({how}); the others were stopped")
