"""BERT's pretraining data, framework-free: vocabulary, WikiText-style reading, next-sentence pairs,
masked-LM masking and padding, as the d2l chapter "The Dataset for Pretraining BERT" builds them, and
the checks and shards of a batch.

Every random choice comes from one ``random.Random(seed)``, never the global state, so the same seed
gives the same batches in any process and for any backend.
"""

from __future__ import annotations

import collections
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError, UsageError
from ..spec.inputs import get_tokens_and_segments
from ..spec.loss import BATCH_FIELDS

RESERVED_TOKENS = ["<pad>", "<mask>", "<cls>", "<sep>"]
MLM_FRACTION = 0.15  # share of each sequence's tokens that are predicted


def tokenize(lines: Sequence[str], token: str = "word") -> list[list[str]]:
    """Split each line into words (on spaces) or characters."""
    if token == "word":
        return [line.split() for line in lines]
    if token == "char":
        return [list(line) for line in lines]
    raise UsageError(f"unknown token type {token!r}: expected 'word' or 'char'")


class Vocab:
    """d2l 1.0's vocabulary: '<unk>', the reserved tokens and every token seen at least ``min_freq``
    times, in sorted order (so the index of each token depends only on the set of tokens)."""

    def __init__(self, tokens: Sequence = (), min_freq: int = 0, reserved_tokens: Sequence[str] = ()) -> None:
        if tokens and isinstance(tokens[0], list):
            tokens = [token for line in tokens for token in line]
        counter = collections.Counter(tokens)
        self.token_freqs = sorted(counter.items(), key=lambda item: item[1], reverse=True)
        kept = [token for token, freq in self.token_freqs if freq >= min_freq]
        self.idx_to_token = sorted(set(["<unk>", *reserved_tokens, *kept]))
        self.token_to_idx = {token: idx for idx, token in enumerate(self.idx_to_token)}

    def __len__(self) -> int:
        return len(self.idx_to_token)

    def __getitem__(self, tokens):
        """The index of a token (or of each token in a list or tuple); unknown tokens map to '<unk>'."""
        if not isinstance(tokens, (list, tuple)):
            return self.token_to_idx.get(tokens, self.unk)
        return [self.__getitem__(token) for token in tokens]

    def to_tokens(self, indices):
        if hasattr(indices, "__len__") and not isinstance(indices, str):
            return [self.idx_to_token[int(index)] for index in indices]
        return self.idx_to_token[int(indices)]

    @property
    def unk(self) -> int:
        return self.token_to_idx["<unk>"]


def read_wiki(path: str | os.PathLike) -> list[list[str]]:
    """Paragraphs (one per line) as lists of sentences, lower-cased and split on ' . ', as d2l reads
    WikiText-2. Lines with fewer than two sentences are skipped: they cannot make a sentence pair."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return paragraphs_from_lines(lines)


def paragraphs_from_lines(lines: Sequence[str]) -> list[list[str]]:
    return [line.strip().lower().split(" . ") for line in lines if len(line.split(" . ")) >= 2]


# --- The built-in corpus -----------------------------------------------------------------------------

_NOUNS = (
    "cat dog bird horse river city village forest garden teacher student doctor farmer king queen "
    "child ship train island mountain valley library museum market castle bridge lake painter singer "
    "soldier merchant"
).split()
_ADJECTIVES = "old young quiet busy small large bright dark famous ancient green cold warm strange gentle".split()
_VERBS = (
    "sees follows finds visits builds paints remembers crosses guards leaves watches helps carries describes admires"
).split()
_PLACES = ("the north", "the south", "the coast", "the hills", "the capital", "the harbour", "the plains")
_TIMES = ("at dawn", "in winter", "in spring", "at night", "every year", "after the war", "before the festival")


def builtin_corpus(num_paragraphs: int = 800, seed: int = 0) -> list[str]:
    """A small WikiText-style corpus that this project writes itself (nothing is downloaded): one
    paragraph per line, sentences separated by ' . '. Each paragraph keeps returning to one topic noun,
    so that true next sentences are recognisably related and next-sentence prediction can be learnt."""
    rng = random.Random(seed)
    templates = (
        "the {adj} {topic} {verb} the {noun}",
        "a {noun} near the {topic} {verb} a {adj} {noun2}",
        "in {place} the {topic} {verb} every {noun}",
        "the {noun} {verb} the {adj} {topic} {time}",
        "many {noun}s say the {topic} is {adj}",
        "the {topic} and the {noun} {verb} the {noun2} together",
    )
    lines = []
    for _ in range(num_paragraphs):
        topic = rng.choice(_NOUNS)
        sentences = []
        for _ in range(rng.randint(3, 7)):
            sentences.append(
                rng.choice(templates).format(
                    adj=rng.choice(_ADJECTIVES),
                    topic=topic,
                    verb=rng.choice(_VERBS),
                    noun=rng.choice(_NOUNS),
                    noun2=rng.choice(_NOUNS),
                    place=rng.choice(_PLACES),
                    time=rng.choice(_TIMES),
                )
            )
        lines.append(" . ".join(sentences) + " .")
    return lines


# --- Next-sentence prediction and masked-LM examples -------------------------------------------------


def _next_sentence(sentence, next_sentence, paragraphs, rng: random.Random):
    """Half the time the true next sentence (label True), else a random sentence of the corpus."""
    if rng.random() < 0.5:
        return sentence, next_sentence, True
    return sentence, rng.choice(rng.choice(paragraphs)), False


def nsp_examples(paragraph, paragraphs, max_len: int, rng: random.Random):
    """(tokens, segments, is_next) for each adjacent sentence pair; pairs that would not fit in
    ``max_len`` with <cls> and two <sep> are dropped, not truncated."""
    examples = []
    for i in range(len(paragraph) - 1):
        tokens_a, tokens_b, is_next = _next_sentence(paragraph[i], paragraph[i + 1], paragraphs, rng)
        if len(tokens_a) + len(tokens_b) + 3 > max_len:
            continue
        tokens, segments = get_tokens_and_segments(tokens_a, tokens_b)
        examples.append((tokens, segments, is_next))
    return examples


def replace_mlm_tokens(
    tokens: list[str], candidate_positions: list[int], num_preds: int, vocab: Vocab, rng: random.Random
) -> tuple[list[str], list[tuple[int, str]]]:
    """Choose ``num_preds`` positions; each becomes '<mask>' 80% of the time, stays 10%, and becomes a
    token drawn uniformly from the whole vocabulary 10% (d2l <= 0.17.0 drew an index there, which
    then read as '<unk>')."""
    mlm_input = list(tokens)
    predictions = []
    rng.shuffle(candidate_positions)
    for position in candidate_positions[:num_preds]:
        if rng.random() < 0.8:
            replacement = "<mask>"
        elif rng.random() < 0.5:
            replacement = tokens[position]
        else:
            replacement = rng.choice(vocab.idx_to_token)
        mlm_input[position] = replacement
        predictions.append((position, tokens[position]))
    return mlm_input, predictions


def num_mlm_predictions(num_tokens: int) -> int:
    return max(1, round(num_tokens * MLM_FRACTION))


def mlm_example(tokens: list[str], vocab: Vocab, rng: random.Random) -> tuple[list[int], list[int], list[int]]:
    """(input ids, prediction positions in increasing order, label ids); <cls> and <sep> are never predicted."""
    candidates = [i for i, token in enumerate(tokens) if token not in ("<cls>", "<sep>")]
    mlm_input, predictions = replace_mlm_tokens(tokens, candidates, num_mlm_predictions(len(tokens)), vocab, rng)
    predictions.sort(key=lambda item: item[0])
    return vocab[mlm_input], [p for p, _ in predictions], vocab[[label for _, label in predictions]]


def pad_examples(examples, max_len: int, vocab: Vocab) -> dict[str, np.ndarray]:
    """Stack examples into arrays. Tokens are padded with '<pad>' to ``max_len``; every example gets
    round(0.15 * max_len) prediction slots, padded with position 0, label 0 and weight 0."""
    slots = round(max_len * MLM_FRACTION)
    pad = vocab["<pad>"]
    arrays: dict[str, list] = {field: [] for field in BATCH_FIELDS}
    for token_ids, positions, labels, segments, is_next in examples:
        arrays["tokens"].append(token_ids + [pad] * (max_len - len(token_ids)))
        arrays["segments"].append(segments + [0] * (max_len - len(segments)))
        arrays["valid_lens"].append(len(token_ids))
        arrays["pred_positions"].append(positions + [0] * (slots - len(positions)))
        arrays["mlm_weights"].append([1.0] * len(labels) + [0.0] * (slots - len(labels)))
        arrays["mlm_labels"].append(labels + [0] * (slots - len(labels)))
        arrays["nsp_labels"].append(int(is_next))
    dtypes = {"valid_lens": np.float32, "mlm_weights": np.float32}  # as d2l makes them
    return {field: np.array(values, dtype=dtypes.get(field, np.int64)) for field, values in arrays.items()}


@dataclass
class PretrainingData:
    """Every padded example of a corpus, and its vocabulary."""

    vocab: Vocab
    max_len: int
    arrays: dict[str, np.ndarray]  # each field of BATCH_FIELDS, one row per example

    @classmethod
    def from_paragraphs(
        cls, paragraphs: list[list[str]], max_len: int = 64, seed: int = 0, min_freq: int = 5
    ) -> PretrainingData:
        rng = random.Random(seed)
        paragraphs = list(paragraphs)
        rng.shuffle(paragraphs)
        tokenized = [tokenize(paragraph) for paragraph in paragraphs]
        sentences = [sentence for paragraph in tokenized for sentence in paragraph]
        vocab = Vocab(sentences, min_freq=min_freq, reserved_tokens=RESERVED_TOKENS)
        pairs = [example for paragraph in tokenized for example in nsp_examples(paragraph, tokenized, max_len, rng)]
        if not pairs:
            raise InputError(f"the corpus gives no sentence pair that fits in max_len={max_len}")
        examples = [(*mlm_example(tokens, vocab, rng), segments, is_next) for tokens, segments, is_next in pairs]
        return cls(vocab, max_len, pad_examples(examples, max_len, vocab))

    def __len__(self) -> int:
        return len(self.arrays["tokens"])

    def batches(
        self, batch_size: int, seed: int = 0, shuffle: bool = True, skip: int = 0
    ) -> Iterator[dict[str, np.ndarray]]:
        """Endless batches of ``batch_size`` examples: an epoch at a time, reshuffled each epoch from
        ``seed``; an epoch's last, smaller batch is dropped so every step sees the same shapes. ``skip``:
        start after that many batches, the same ones as drawing and dropping them, without making them
        (a resumed run reaches its step at the cost of one shuffle per epoch it passes)."""
        if not 1 <= batch_size <= len(self):
            raise UsageError(f"batch_size {batch_size} must be in [1, {len(self)}] (the number of examples)")
        rng = np.random.default_rng(seed)
        per_epoch = len(self) // batch_size
        epochs, offset = divmod(skip, per_epoch)
        for _ in range(epochs):
            if shuffle:
                rng.permutation(len(self))
        while True:
            order = rng.permutation(len(self)) if shuffle else np.arange(len(self))
            for start in range(offset * batch_size, len(self) - batch_size + 1, batch_size):
                rows = order[start : start + batch_size]
                yield {field: values[rows] for field, values in self.arrays.items()}
            offset = 0


def shard(batch: dict[str, np.ndarray], rank: int, workers: int) -> dict[str, np.ndarray]:
    """Worker ``rank``'s rows of a batch: the rank-th of ``workers`` equal, contiguous slices, so that
    the workers together see exactly the batch one process would."""
    size = len(batch["tokens"])
    if not 0 <= rank < workers or size % workers:
        raise UsageError(f"a batch of {size} cannot be split into {workers} equal shards (rank {rank})")
    rows = slice(rank * size // workers, (rank + 1) * size // workers)
    return {name: values[rows] for name, values in batch.items()}
