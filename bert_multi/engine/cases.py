"""The conformance input cases: one list, used by the tests and the command line alike.

Each case turns a config and a seed into one batch (tokens, segments, valid_lens, pred_positions).
Together they cover what conformance asks for (docs/design.md): mixed valid_lens, valid_len equal to the length,
valid_len 0, 2-D valid_lens, no valid_lens, single and paired segments, repeated and edge
pred_positions (0 and T-1), batch 1, T = max_len, and no pred_positions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import UsageError
from ..spec.config import BERTConfig

Batch = dict[str, "np.ndarray | None"]

# T = max_len is a rule about the positional table's last row, proven the same at 64 as at 1000; at the
# chapter's 1000 the one case cost more than all the others together (attention grows as T^2), so it runs
# on the model cut to its first 64 positions (``schema.cut_max_len``).
CUT_MAX_LEN = 64


class CaseInput(NamedTuple):
    """One case's inputs, and the max_len of the model that runs them (None: the config's own)."""

    name: str
    batch: Batch
    max_len: int | None = None

    def cut(self, config: BERTConfig) -> int | None:
        """The max_len the model is cut to for this case, if shorter than ``config``'s; else None."""
        return None if self.max_len in (None, config.max_len) else self.max_len


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    make: Callable[[BERTConfig, np.random.Generator], Batch]
    cut_to: int | None = None  # run on the model cut to this max_len when the config's is longer

    def batch(self, config: BERTConfig, seed: int = 0) -> Batch:
        return self.make(config, np.random.default_rng(seed))

    def input(self, config: BERTConfig, seed: int = 0) -> CaseInput:
        """The case as the conformance engine runs it: on the model cut to ``cut_to`` when it has one."""
        if self.cut_to is None or config.max_len <= self.cut_to:
            return CaseInput(self.name, self.batch(config, seed))
        return CaseInput(self.name, self.batch(dataclasses.replace(config, max_len=self.cut_to), seed), self.cut_to)


def _steps(config: BERTConfig, wanted: int = 12) -> int:
    return min(wanted, config.max_len)


def _paired_segments(B: int, T: int, rng: np.random.Generator) -> np.ndarray:
    """<cls> a <sep> b <sep> layouts: segment 0 up to a random split, 1 after it."""
    splits = rng.integers(1, max(T, 2), size=B)
    return (np.arange(T)[None, :] >= splits[:, None]).astype(np.int64)


def _batch(
    config: BERTConfig,
    rng: np.random.Generator,
    B: int,
    T: int,
    valid_lens: np.ndarray | None,
    pred_positions: np.ndarray | None,
    paired: bool = True,
) -> Batch:
    tokens = rng.integers(0, config.vocab_size, size=(B, T))
    segments = _paired_segments(B, T, rng) if paired else np.zeros((B, T), dtype=np.int64)
    return {"tokens": tokens, "segments": segments, "valid_lens": valid_lens, "pred_positions": pred_positions}


def _positions(rng: np.random.Generator, B: int, T: int, P: int = 3) -> np.ndarray:
    return rng.integers(0, T, size=(B, P))


def _mixed(config: BERTConfig, rng: np.random.Generator) -> Batch:
    T = _steps(config)
    valid_lens = np.array([T, max(T // 2, 1), 1, 0])
    return _batch(config, rng, 4, T, valid_lens, _positions(rng, 4, T))


def _full(config: BERTConfig, rng: np.random.Generator) -> Batch:
    T = _steps(config)
    return _batch(config, rng, 2, T, np.full(2, T), _positions(rng, 2, T))


def _zero(config: BERTConfig, rng: np.random.Generator) -> Batch:
    T = _steps(config)
    return _batch(config, rng, 2, T, np.zeros(2, dtype=np.int64), _positions(rng, 2, T))


def _two_d(config: BERTConfig, rng: np.random.Generator) -> Batch:
    T = _steps(config)
    valid_lens = np.stack([np.arange(1, T + 1), rng.integers(0, T + 1, size=T), np.full(T, T)])
    return _batch(config, rng, 3, T, valid_lens, _positions(rng, 3, T))


def _none(config: BERTConfig, rng: np.random.Generator) -> Batch:
    T = _steps(config)
    return _batch(config, rng, 2, T, None, _positions(rng, 2, T))


def _single_segment(config: BERTConfig, rng: np.random.Generator) -> Batch:
    T = _steps(config)
    return _batch(config, rng, 2, T, np.array([T, max(T - 3, 0)]), _positions(rng, 2, T), paired=False)


def _edge_positions(config: BERTConfig, rng: np.random.Generator) -> Batch:
    T = _steps(config)
    positions = np.array([[0, T - 1, T - 1, 0], [T - 1, 0, T // 2, T // 2]])
    return _batch(config, rng, 2, T, np.array([T, max(T // 2, 1)]), positions)


def _batch_one(config: BERTConfig, rng: np.random.Generator) -> Batch:
    T = _steps(config)
    return _batch(config, rng, 1, T, np.array([max(T - 2, 0)]), _positions(rng, 1, T))


def _max_len(config: BERTConfig, rng: np.random.Generator) -> Batch:
    T = config.max_len
    return _batch(config, rng, 1, T, np.array([T - T // 3]), np.array([[0, T // 2, T - 1]]))


def _no_predictions(config: BERTConfig, rng: np.random.Generator) -> Batch:
    T = _steps(config)
    return _batch(config, rng, 2, T, np.array([T, 2 % (T + 1)]), None)


CASES: tuple[Case, ...] = (
    Case("mixed_valid_lens", "valid_lens T, T/2, 1 and 0 in one batch; paired segments", _mixed),
    Case("full_valid_len", "every valid_len equals the length", _full),
    Case("valid_len_zero", "valid_len 0: every key masked, attention uniform", _zero),
    Case("valid_lens_2d", "2-D valid_lens, a length per query position", _two_d),
    Case("no_valid_lens", "valid_lens None: nothing masked", _none),
    Case("single_segment", "one sentence, every segment 0", _single_segment),
    Case("edge_pred_positions", "pred_positions 0 and T-1, repeated", _edge_positions),
    Case("batch_one", "batch of one", _batch_one),
    Case(
        "max_len", f"T equal to max_len, batch of one (max_len cut to {CUT_MAX_LEN} if longer)", _max_len, CUT_MAX_LEN
    ),
    Case("no_pred_positions", "pred_positions None: no MLM output", _no_predictions),
)
CASE_NAMES = tuple(case.name for case in CASES)
# The cases that take distinct paths through a model's kernels: one length per sequence (T, T/2, 1 and 0,
# so a masked key and a row that masks every key), one per query, none. On a GPU, where a backend that
# compiles a program for each input shape pays about a second for each, its earlier generations and its
# fixtures are checked on these (the CPU suite checks every case).
KERNEL_PATHS = ("mixed_valid_lens", "valid_lens_2d", "no_valid_lens")


def get_case(name: str) -> Case:
    for case in CASES:
        if case.name == name:
            return case
    raise UsageError(f"unknown case {name!r}: expected one of {list(CASE_NAMES)}")
