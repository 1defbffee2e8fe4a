"""``verify_masking``: hold a user's masked-LM data rule (d2l's ``_get_mlm_data_from_tokens(tokens,
vocab)``) to BERT's, by running it many times and checking by statistics.

The rule: of a sequence of n tokens, max(1, round(0.15 n)) positions are predicted, never <cls> or
<sep>; each predicted token is replaced by <mask> 80% of the time, kept 10%, and replaced by a token drawn
uniformly from the whole vocabulary 10%; every other token is left alone; the labels are the original
tokens. d2l's code draws with Python's ``random``, which is seeded here (and restored after).

Each statistical check is a two-sided test at z = 5 (a false alarm once in 1.7 million runs of it), or a
chi-square test at the same level; five of them make a false alarm less likely than 1 in 300,000 per
call of ``verify_masking``. The fixed seed makes every result reproducible.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .subject import call_user

Z = 5.0  # two-sided normal quantile of every test: P(|N(0,1)| > 5) = 5.7e-7
SPECIAL = ("<unk>", "<pad>", "<mask>", "<cls>", "<sep>")


class Vocab:
    """The parts of d2l's ``Vocab`` a masking function uses: ``idx_to_token``, ``token_to_idx``,
    ``len``, and indexing by a token or a list of tokens (an unknown one is ``<unk>``)."""

    def __init__(self, words: Sequence[str]) -> None:
        self.idx_to_token = list(SPECIAL) + list(words)
        self.token_to_idx = {token: index for index, token in enumerate(self.idx_to_token)}

    def __len__(self) -> int:
        return len(self.idx_to_token)

    def __getitem__(self, tokens: Any) -> Any:
        if not isinstance(tokens, (list, tuple)):
            return self.token_to_idx.get(tokens, 0)
        return [self[token] for token in tokens]

    def to_tokens(self, indices: Any) -> Any:
        if not isinstance(indices, (list, tuple)):
            return self.idx_to_token[indices]
        return [self.idx_to_token[index] for index in indices]

    @property
    def unk(self) -> int:
        return 0


@dataclass(frozen=True)
class MaskingCheck:
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class MaskingReport:
    calls: int
    predictions: int
    checks: tuple[MaskingCheck, ...]

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(check.passed for check in self.checks)

    def describe(self) -> str:
        lines = [f"{'PASS' if c.passed else 'FAIL'} {c.name}: {c.detail}" for c in self.checks]
        verdict = "follows" if self.passed else "does not follow"
        return "\n".join(lines + [f"the masking function {verdict} BERT's rule ({self.predictions} predictions "
                                  f"in {self.calls} calls)"])  # fmt: skip


def _sentence(rng: random.Random, words: list[str]) -> list[str]:
    a, b = rng.randint(1, 30), rng.randint(0, 30)
    tokens = ["<cls>"] + [rng.choice(words) for _ in range(a)] + ["<sep>"]
    return tokens + ([rng.choice(words) for _ in range(b)] + ["<sep>"] if b else [])


def _proportion(name: str, count: int, total: int, p: float) -> MaskingCheck:
    expected = total * p
    spread = math.sqrt(total * p * (1 - p)) or 1.0
    z = (count - expected) / spread
    detail = f"{count} of {total} ({count / max(total, 1):.3f}), expected {p:.3f} (z = {z:+.1f})"
    return MaskingCheck(name, abs(z) <= Z, detail)


def _chi_square_limit(df: int) -> float:
    """The chi-square quantile at the level of a two-sided z = 5 (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + Z * math.sqrt(2 / (9 * df))) ** 3


def verify_masking(
    function: Callable[[list[str], Vocab], Any], calls: int = 3000, seed: int = 0, words: int = 20
) -> MaskingReport:
    """Run ``function(tokens, vocab)`` (d2l's ``_get_mlm_data_from_tokens``, returning (input ids,
    pred_positions, label ids)) ``calls`` times on random two-sentence sequences over a vocabulary of
    ``words`` words plus d2l's special tokens, and check its results against BERT's masking rule."""
    vocab = Vocab([f"w{i}" for i in range(words)])
    ordinary = vocab.idx_to_token[len(SPECIAL) :]
    rng = random.Random(seed)
    state = random.getstate()
    random.seed(seed)
    rules: list[str] = []
    outcomes = {"mask": 0, "kept": 0, "random": 0}
    drawn: list[tuple[int, int]] = []  # (original id, drawn id) of each replacement by another token
    try:
        for _ in range(calls):
            tokens = _sentence(rng, ordinary)
            returned = call_user("your masking function", function, list(tokens), vocab)
            _check_call(tokens, returned, vocab, rules, outcomes, drawn)
    finally:
        random.setstate(state)
    total = sum(outcomes.values())
    checks = [MaskingCheck("the rules of every call", not rules, rules[0] if rules else f"{calls} calls, none broken")]
    if total == 0:  # every call broke a rule: no statistics to take, and a failure
        return MaskingReport(calls, total, (*checks, MaskingCheck("predictions", False, "none to count")))
    V = len(vocab)
    # A random draw may be <mask> itself, or the original token: counted as those.
    checks.append(_proportion("replaced by <mask>", outcomes["mask"], total, 0.8 + 0.1 / V))
    checks.append(_proportion("kept", outcomes["kept"], total, 0.1 + 0.1 / V))
    checks.append(_proportion("replaced by another token", outcomes["random"], total, 0.1 * (V - 2) / V))
    checks.append(_uniform(drawn, vocab))
    return MaskingReport(calls, total, tuple(checks))


def _uniform(drawn: list[tuple[int, int]], vocab: Vocab) -> MaskingCheck:
    """The replacements are uniform over the whole vocabulary (but the original and <mask>, which a draw
    cannot be told from)."""
    V = len(vocab)
    mask = vocab["<mask>"]
    if len(drawn) < 5 * V:
        return MaskingCheck("random tokens uniform over the vocabulary", False, f"only {len(drawn)} random draws")
    observed = np.zeros(V)
    expected = np.full(V, 0.0)
    for original, token in drawn:
        observed[token] += 1
        expected += 1.0 / (V - 2)
        expected[[original, mask]] -= 1.0 / (V - 2)
    keep = np.arange(V) != mask
    chi2 = float(((observed[keep] - expected[keep]) ** 2 / np.maximum(expected[keep], 1e-12)).sum())
    limit = _chi_square_limit(V - 2)
    never = [vocab.idx_to_token[i] for i in np.flatnonzero((observed == 0) & keep)]
    detail = f"chi-square {chi2:.1f} over {V} tokens, limit {limit:.1f}" + (
        f"; never drawn: {never[:6]}" if never else ""
    )
    unknown = observed[vocab.unk] / len(drawn)
    if unknown > 0.5:
        detail += (
            f"; {unknown:.0%} of the random replacements are <unk>: the random branch draws what the vocabulary "
            "does not know, such as an index where a token was meant (d2l <= 0.17.0's random.randint)"
        )
    return MaskingCheck("random tokens uniform over the vocabulary", chi2 <= limit, detail)


def _check_call(
    tokens: list[str],
    returned: Any,
    vocab: Vocab,
    rules: list[str],
    outcomes: dict[str, int],
    drawn: list[tuple[int, int]],
) -> None:
    """The rules one call must keep; its outcomes counted for the statistics."""
    if not isinstance(returned, (tuple, list)) or len(returned) != 3:
        rules.append(f"returned {type(returned).__name__}; expected (input ids, pred_positions, labels)")
        return
    ids, positions, labels = (list(part) for part in returned)
    original = vocab[tokens]
    n = len(tokens)
    candidates = [i for i, token in enumerate(tokens) if token not in ("<cls>", "<sep>")]
    wanted = min(max(1, round(n * 0.15)), len(candidates))
    problem = None
    if len(ids) != n:
        problem = f"{len(ids)} input ids for {n} tokens"
    elif len(positions) != wanted or len(labels) != len(positions):
        problem = f"{len(positions)} predictions ({len(labels)} labels) for {n} tokens"
        problem += f"; expected max(1, round(0.15 n)) = {wanted}"
    elif len(set(positions)) != len(positions) or not set(positions) <= set(candidates):
        problem = f"pred_positions {positions} repeat or fall on <cls>/<sep> or outside the sequence ({tokens})"
    elif labels != [original[p] for p in positions]:
        problem = f"labels {labels} are not the original tokens' ids {[original[p] for p in positions]}"
    elif any(ids[i] != original[i] for i in range(n) if i not in positions):
        problem = "a token that is not predicted was changed"
    if problem:
        rules.append(f"{problem} (tokens {tokens})")
        return
    for p in positions:
        if ids[p] == vocab["<mask>"]:
            outcomes["mask"] += 1
        elif ids[p] == original[p]:
            outcomes["kept"] += 1
        else:
            outcomes["random"] += 1
            drawn.append((original[p], int(ids[p])))
