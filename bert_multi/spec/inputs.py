"""BERT's input representation and the input checks every backend runs before any framework sees data."""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from ..arrays import first_index
from ..errors import InputError
from .config import BERTConfig


def get_tokens_and_segments(tokens_a: list[str], tokens_b: list[str] | None = None) -> tuple[list[str], list[int]]:
    """``<cls> a <sep>`` with segment 0, then ``b <sep>`` with segment 1 when a second sentence is given."""
    tokens = ["<cls>", *tokens_a, "<sep>"]
    segments = [0] * (len(tokens_a) + 2)
    if tokens_b is not None:
        tokens += [*tokens_b, "<sep>"]
        segments += [1] * (len(tokens_b) + 1)
    return tokens, segments


class ModelInputs(NamedTuple):
    """Checked inputs, as int64 NumPy arrays; what a backend's forward receives."""

    tokens: np.ndarray  # (B, T)
    segments: np.ndarray  # (B, T)
    valid_lens: np.ndarray | None  # (B,) or (B, T)
    pred_positions: np.ndarray | None  # (B, P)


def _as_array(name: str, value: object, kinds: str = "iu") -> np.ndarray:
    """``value`` as an array whose dtype kind is in ``kinds`` (NumPy's codes: i, u ints, f floats)."""
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    how = "pass a NumPy array (from PyTorch: .detach().cpu().numpy(); from MXNet: .asnumpy())"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NumPy < 1.24 only warns on ragged lists; they are caught below
            array = np.asarray(value)
    except ValueError:  # NumPy >= 1.24 refuses ragged lists
        array = np.empty(0, dtype=object)
    except Exception as error:  # noqa: BLE001 - a framework tensor that will not convert (needs grad, on a GPU)
        raise InputError(f"{name} is a {kind} that NumPy cannot read ({error}); {how}") from None
    if array.dtype == object:
        if isinstance(value, (list, tuple)):
            raise InputError(f"{name} is not a rectangular array of numbers")
        raise InputError(f"{name} is a {kind}, which NumPy does not read as numbers; {how}")
    if array.dtype.kind not in kinds:  # bool, complex, strings and objects are never valid
        expected = "an integer or float dtype" if "f" in kinds else "an integer dtype (e.g. int64)"
        raise InputError(f"{name} has dtype {array.dtype}: expected {expected}")
    return array


def _first_offender(name: str, array: np.ndarray, bad: np.ndarray) -> str:
    """'name[i, j] = value' for the first element of ``array`` where ``bad`` holds."""
    index = first_index(bad)
    return f"{name}[{', '.join(map(str, index))}] = {array[index]}"


def _require_within(name: str, array: np.ndarray, low: int, high: int, expected: str) -> None:
    """Raise naming the first element of ``array`` outside [low, high]."""
    outside = (array < low) | (array > high)
    if outside.any():
        raise InputError(f"{_first_offender(name, array, outside)} is out of range: expected {expected}")


def check_inputs(
    config: BERTConfig, tokens: object, segments: object, valid_lens: object = None, pred_positions: object = None
) -> ModelInputs:
    """Check a batch against ``config`` and return it as int64 arrays, or raise ``InputError``.

    tokens: integers (B, T) in [0, vocab_size), with 1 <= T <= max_len. segments: integers in {0, 1}
    of the tokens' shape. valid_lens: (B,) or (B, T), integer or float dtype (d2l passes float32) with
    integral values in [0, T]. pred_positions: integers (B, P), P >= 1, in [0, T).
    """
    tokens = _as_array("tokens", tokens)
    if tokens.ndim != 2 or 0 in tokens.shape:
        raise InputError(f"tokens has shape {tokens.shape}: expected (batch_size, num_steps) with both >= 1")
    B, T = tokens.shape
    if T > config.max_len:
        raise InputError(f"tokens has {T} steps, more than max_len={config.max_len} positional embeddings")
    _require_within("tokens", tokens, 0, config.vocab_size - 1, f"token ids in [0, {config.vocab_size}) (vocab_size)")

    segments = _as_array("segments", segments)
    if segments.shape != tokens.shape:
        raise InputError(f"segments has shape {segments.shape}: expected the tokens' shape {tokens.shape}")
    _require_within("segments", segments, 0, 1, "segment ids in {0, 1}")

    if valid_lens is not None:
        valid_lens = _as_array("valid_lens", valid_lens, kinds="iuf")
        if valid_lens.shape not in ((B,), (B, T)):
            raise InputError(f"valid_lens has shape {valid_lens.shape}: expected ({B},) or ({B}, {T})")
        if valid_lens.dtype.kind == "f":
            not_integral = ~np.isfinite(valid_lens) | (valid_lens != np.round(valid_lens))
            if not_integral.any():
                offender = _first_offender("valid_lens", valid_lens, not_integral)
                raise InputError(f"{offender} is not a whole number: expected integral lengths")
        _require_within("valid_lens", valid_lens, 0, T, f"lengths in [0, {T}] (num_steps)")
        valid_lens = valid_lens.astype(np.int64)

    if pred_positions is not None:
        pred_positions = _as_array("pred_positions", pred_positions)
        if pred_positions.ndim != 2 or pred_positions.shape[0] != B or pred_positions.shape[1] == 0:
            raise InputError(
                f"pred_positions has shape {pred_positions.shape}: "
                f"expected ({B}, num_pred_positions) with num_pred_positions >= 1"
            )
        _require_within("pred_positions", pred_positions, 0, T - 1, f"positions in [0, {T}) (num_steps)")
        pred_positions = pred_positions.astype(np.int64)

    return ModelInputs(tokens.astype(np.int64), segments.astype(np.int64), valid_lens, pred_positions)


def valid_lens_from_attention_mask(attention_mask: object) -> np.ndarray:
    """d2l's ``valid_lens`` (B,) from a HuggingFace-style ``attention_mask`` (B, T) of 1s then 0s.

    A right-padded mask says the same as a valid length, so BERT computes the same function from either.
    A mask that no length can express (left padding, holes in it, values other than 0 and 1) is an
    ``InputError`` naming the first such row: d2l's BERT masks keys by length only.
    """
    mask = _as_array("attention_mask", attention_mask, kinds="iub")
    if mask.ndim != 2:
        raise InputError(f"attention_mask must have shape (B, T), got {mask.shape}")
    if not np.isin(mask, (0, 1)).all():
        offender = _first_offender("attention_mask", mask, ~np.isin(mask, (0, 1)))
        raise InputError(f"attention_mask must hold only 0 and 1; {offender}")
    lengths = mask.sum(axis=1)
    right_padded = mask == (np.arange(mask.shape[1])[None, :] < lengths[:, None])
    if not right_padded.all():
        row = int(np.flatnonzero(~right_padded.all(axis=1))[0])
        raise InputError(
            f"attention_mask row {row} is {mask[row].astype(int).tolist()}: valid_lens express right padding "
            "only (1s, then 0s); left padding or holes have no valid_lens: re-pad on the right"
        )
    return lengths.astype(np.int64)
