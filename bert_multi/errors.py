"""The project's exceptions. Each message says what is wrong and what was expected."""


class InputError(ValueError):
    """A model input (tokens, segments, valid_lens, pred_positions) breaks the model's contract."""


class WeightsError(ValueError):
    """A weight dict or weight file does not match the canonical schema, or is corrupt."""


class BackendUnavailable(ImportError):
    """A backend's framework is not installed here, or cannot run with what is installed."""


class WorkerFailed(RuntimeError):
    """A worker of a data-parallel run raised or died; the other workers were stopped."""
