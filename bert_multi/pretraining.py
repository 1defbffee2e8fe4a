"""BERT's pretraining data, framework-free: vocabulary, WikiText-style reading, next-sentence pairs,
masked-LM masking and padding, as the d2l chapter "The Dataset for Pretraining BERT" builds them.

Every random choice comes from one ``random.Random(seed)``, never the global state, so the same seed
gives the same batches in any process and for any backend.
"""

from __future__ import annotations

import collections
import json
import os
import random
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .config import HEADS, BERTConfig
from .errors import InputError, WeightsError
from .files import NpzReader, open_regular
from .inputs import check_inputs, get_tokens_and_segments
from .registry import backends, load_backend
from .schema import validate_weights
from .weights import MANIFEST_KEY, load_weights, read_json_manifest, save_weights, write_npz

RESERVED_TOKENS = ["<pad>", "<mask>", "<cls>", "<sep>"]
MLM_FRACTION = 0.15  # share of each sequence's tokens that are predicted
BATCH_FIELDS = ("tokens", "segments", "valid_lens", "pred_positions", "mlm_weights", "mlm_labels", "nsp_labels")


def tokenize(lines: Sequence[str], token: str = "word") -> list[list[str]]:
    """Split each line into words (on spaces) or characters."""
    if token == "word":
        return [line.split() for line in lines]
    if token == "char":
        return [list(line) for line in lines]
    raise ValueError(f"unknown token type {token!r}: expected 'word' or 'char'")


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

    def batches(self, batch_size: int, seed: int = 0, shuffle: bool = True) -> Iterator[dict[str, np.ndarray]]:
        """Endless batches of ``batch_size`` examples: an epoch at a time, reshuffled each epoch from
        ``seed``; an epoch's last, smaller batch is dropped so every step sees the same shapes."""
        if not 1 <= batch_size <= len(self):
            raise ValueError(f"batch_size {batch_size} must be in [1, {len(self)}] (the number of examples)")
        rng = np.random.default_rng(seed)
        while True:
            order = rng.permutation(len(self)) if shuffle else np.arange(len(self))
            for start in range(0, len(self) - batch_size + 1, batch_size):
                rows = order[start : start + batch_size]
                yield {field: values[rows] for field, values in self.arrays.items()}


class LossValues(NamedTuple):
    total: float
    mlm: float
    nsp: float


class BatchTotals(NamedTuple):
    """What the loss of a whole batch divides by. A worker holding one shard of a batch divides its
    sums by the whole batch's totals, so the workers' losses add up to the loss of the whole batch
    (and their gradients to its gradient) whatever each shard holds."""

    mlm_weight: float  # the sum of mlm_weights: the real prediction slots
    examples: int  # the batch size, over which NSP is averaged
    slots: int  # every prediction slot, padding included ("all_slots" normalization)

    @classmethod
    def of(cls, batch: dict[str, np.ndarray]) -> BatchTotals:
        weights = np.asarray(batch["mlm_weights"])
        return cls(float(weights.sum(dtype=np.float64)), int(weights.shape[0]), int(weights.size))


def shard(batch: dict[str, np.ndarray], rank: int, workers: int) -> dict[str, np.ndarray]:
    """Worker ``rank``'s rows of a batch: the rank-th of ``workers`` equal, contiguous slices, so that
    the workers together see exactly the batch one process would."""
    size = len(batch["tokens"])
    if not 0 <= rank < workers or size % workers:
        raise ValueError(f"a batch of {size} cannot be split into {workers} equal shards (rank {rank})")
    rows = slice(rank * size // workers, (rank + 1) * size // workers)
    return {name: values[rows] for name, values in batch.items()}


def free_address() -> str:
    """127.0.0.1 and a port no one listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


OPTIMIZERS = ("adam", "sgd")
MLM_NORMALIZATIONS = ("real_slots", "all_slots")  # all_slots: d2l's PyTorch code, padding averaged in
ADAM_EPSILON_STYLES = ("torch", "mxnet")


def check_training_options(optimizer: str, mlm_normalization: str, adam_epsilon_style: str) -> None:
    for name, value, allowed in (
        ("optimizer", optimizer, OPTIMIZERS),
        ("mlm_normalization", mlm_normalization, MLM_NORMALIZATIONS),
        ("adam_epsilon_style", adam_epsilon_style, ADAM_EPSILON_STYLES),
    ):
        if value not in allowed:
            raise ValueError(f"unknown {name} {value!r}: expected one of {list(allowed)}")


def check_trainable(config: BERTConfig, train_positions: bool) -> None:
    """Pretraining needs both pretraining heads; freezing the positional embedding (as d2l 0.16-0.17's
    PyTorch code did, by adding ``pos_embedding.data``) needs a learned one."""
    if config.heads != HEADS:
        raise ValueError(
            f"pretraining needs the pooler and both heads (MLM and NSP); this model has only {list(config.heads)}"
        )
    if not train_positions and config.semantics.positions != "learned":
        raise ValueError(
            f"there are no positional embeddings to freeze: preset {config.semantics.name!r} adds a fixed "
            "sinusoidal table"
        )


def check_batch(config: BERTConfig, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model inputs checked as usual, and the labels: mlm_labels in [0, vocab_size), mlm_weights
    finite and non-negative, nsp_labels in {0, 1}, all with matching shapes. Raises ``InputError``."""
    missing = [field for field in BATCH_FIELDS if field not in batch]
    if missing:
        raise InputError(f"a pretraining batch needs {list(BATCH_FIELDS)}; missing {missing}")
    inputs = check_inputs(config, batch["tokens"], batch["segments"], batch["valid_lens"], batch["pred_positions"])
    if inputs.valid_lens is None or inputs.pred_positions is None:
        raise InputError("a pretraining batch needs valid_lens and pred_positions, not None")
    B, P = inputs.pred_positions.shape
    labels = np.asarray(batch["mlm_labels"])
    weights = np.asarray(batch["mlm_weights"])
    nsp = np.asarray(batch["nsp_labels"])
    for name, array, shape in (
        ("mlm_labels", labels, (B, P)),
        ("mlm_weights", weights, (B, P)),
        ("nsp_labels", nsp, (B,)),
    ):
        if array.shape != shape:
            raise InputError(f"{name} has shape {array.shape}: expected {shape}")
    if labels.dtype.kind not in "iu" or nsp.dtype.kind not in "iu":
        raise InputError("mlm_labels and nsp_labels must be integer arrays")
    if labels.size and (labels.min() < 0 or labels.max() >= config.vocab_size):
        raise InputError(
            f"mlm_labels must be token ids in [0, {config.vocab_size}), got {labels.min()}..{labels.max()}"
        )
    if not np.isin(nsp, (0, 1)).all():
        raise InputError("nsp_labels must be 0 or 1")
    if weights.dtype.kind != "f" or not np.isfinite(weights).all() or (weights < 0).any():
        raise InputError("mlm_weights must be finite, non-negative floats")
    return {
        "tokens": inputs.tokens,
        "segments": inputs.segments,
        "valid_lens": inputs.valid_lens,
        "pred_positions": inputs.pred_positions,
        "mlm_weights": weights,
        "mlm_labels": labels.astype(np.int64),
        "nsp_labels": nsp.astype(np.int64),
    }


# --- Running it ----------------------------------------------------------------------------------------


STATE_FILE = "state.npz"
STATE_FORMAT = "bert_multi.training_state"


class TrainingState(NamedTuple):
    """Everything a run needs to go on after ``step`` steps: the weights, the optimizer's state (canonical
    arrays, see each backend's ``Pretrainer.state``) and the settings that drew its batches."""

    step: int
    config: BERTConfig
    weights: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    settings: dict


def save_training_state(directory: str | os.PathLike, state: TrainingState) -> Path:
    """``directory/state.npz``, replaced atomically: a run killed at any moment, even while writing it,
    leaves the previous state whole. The batches' position is the step (they are drawn from the seed)."""
    manifest = {"format": STATE_FORMAT, "format_version": 1, "step": state.step, "config": state.config.to_dict()}
    manifest["settings"] = state.settings
    arrays = {f"weights.{name}": array for name, array in state.weights.items()}
    arrays.update({f"optimizer.{name}": array for name, array in state.optimizer.items()})
    path = Path(directory) / STATE_FILE
    write_npz(path, manifest, arrays)
    return path


def load_training_state(directory: str | os.PathLike) -> TrainingState | None:
    """The state ``save_training_state`` left in ``directory``, or None if there is none. A file that is
    not one, or is damaged, is a ``WeightsError`` naming it."""
    path = Path(directory) / STATE_FILE
    if not path.exists():
        return None
    with open_regular(path, "training state", WeightsError) as file:
        archive = NpzReader(file, path, WeightsError)
        manifest = read_json_manifest(path, archive, "training state")
        try:
            if manifest.get("format") != STATE_FORMAT or manifest.get("format_version") != 1:
                raise ValueError(f"format {manifest.get('format')!r}, expected {STATE_FORMAT!r} version 1")
            step, settings = manifest["step"], manifest["settings"]
            if not isinstance(step, int) or step < 0 or not isinstance(settings, dict):
                raise ValueError("a step that is not a count, or settings that are not a dict")
            config = BERTConfig.from_dict(manifest["config"])
        except (ValueError, TypeError, KeyError) as error:
            raise WeightsError(f"{path}: not a readable training state: {error}") from None
        arrays = {name: archive.read(name, archive.header(name)) for name in archive.names if name != MANIFEST_KEY}
    weights = {name[len("weights.") :]: array for name, array in arrays.items() if name.startswith("weights.")}
    optimizer = {name[len("optimizer.") :]: array for name, array in arrays.items() if name.startswith("optimizer.")}
    try:
        validate_weights(config, weights)
    except WeightsError as error:
        raise WeightsError(f"{path}: {error}") from None
    return TrainingState(step, config, weights, optimizer, settings)


@dataclass
class TrainingRun:
    """The losses of each step of one backend's run, how long it took and the weights it ended with."""

    backend: str
    losses: list[LossValues]
    seconds: float
    tokens: int  # valid (non-padding) tokens processed
    runtime: dict
    weights: dict[str, np.ndarray]
    rank: int = 0  # which worker of a data-parallel run returned it

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")


def save_run(directory: str | os.PathLike, config: BERTConfig, run: TrainingRun) -> None:
    """What worker 0 of a data-parallel run hands back to the process that launched it."""
    save_weights(Path(directory) / "weights.npz", config, run.weights)
    summary = {"losses": run.losses, "seconds": run.seconds, "tokens": run.tokens, "runtime": run.runtime}
    (Path(directory) / "run.json").write_text(json.dumps(summary))


def load_run(directory: str | os.PathLike, backend_name: str) -> TrainingRun:
    """The run ``save_run`` left in ``directory``."""
    summary = json.loads((Path(directory) / "run.json").read_text())
    _, weights = load_weights(Path(directory) / "weights.npz")
    losses = [LossValues(*values) for values in summary["losses"]]
    return TrainingRun(backend_name, losses, summary["seconds"], summary["tokens"], summary["runtime"], weights)


def relay_steps(progress, on_step) -> None:
    """Pass the (step, losses) worker 0 has queued so far to ``on_step``, in order."""
    while not progress.empty():
        step, values = progress.get()
        if on_step:
            on_step(step, LossValues(*values))


def run_pretraining(
    backend_name: str,
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    data: PretrainingData,
    steps: int,
    batch_size: int,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    on_step=None,
    rank: int = 0,
    workers: int = 1,
    checkpoint_every: int = 0,
    checkpoint_dir: str | os.PathLike | None = None,
    resume: bool = False,
    **options,
) -> TrainingRun:
    """``steps`` optimizer steps of ``backend_name`` from ``weights`` on ``data``'s batches (drawn from
    ``seed``, so two backends given the same seed see the same batches). ``options`` go to the
    backend's ``Pretrainer`` (optimizer, lr, mlm_normalization, adam_epsilon, adam_epsilon_style,
    train_positions).
    ``on_step(step, losses)`` is called after each step.

    With ``workers`` > 1 this process is worker ``rank`` of a data-parallel run whose process group the
    caller has set up: it draws every batch of ``batch_size`` as one process would and trains on its
    shard (``shard``), and the framework's engine combines the gradients; losses are the whole batch's.

    ``checkpoint_every`` K > 0 saves the whole training state to ``checkpoint_dir`` every K steps (worker
    0 does); ``resume`` goes on from the state there, if any, to ``steps`` in all, and ends with the
    weights an uninterrupted run ends with. The losses returned are those of the steps this call took."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if batch_size % workers:
        raise ValueError(f"batch_size {batch_size} must be a multiple of the number of workers, {workers}")
    if (checkpoint_every or resume) and checkpoint_dir is None:
        raise ValueError("checkpoints and resuming need a checkpoint directory")
    settings = {"backend": backend_name, "dtype": dtype, "seed": seed, "batch_size": batch_size, **options}
    settings = json.loads(json.dumps(settings))  # as a saved state holds them (tuples become lists)
    state = load_training_state(checkpoint_dir) if resume and checkpoint_dir is not None else None
    if state is not None:
        if state.config != config or state.settings != settings:
            raise ValueError(
                f"{checkpoint_dir}: its state was saved by a run with {state.config} and {state.settings}, not "
                f"{config} and {settings}; resume with the same settings"
            )
        weights = state.weights
    start = state.step if state else 0
    backend = load_backend(backend_name)
    if not backend.can_train:
        trainable = [name for name, status in backends().items() if status.available and load_backend(name).can_train]
        raise ValueError(f"backend {backend_name!r} cannot train (it has no Pretrainer): use one of {trainable}")
    model = backend.build(config, weights, device=device, dtype=dtype)
    trainer = backend.trainer(model, **options, **({"distributed": True} if workers > 1 else {}))
    if state:
        trainer.load_state(state.optimizer, start)
    saves = checkpoint_dir if checkpoint_every and rank == 0 else None  # where this worker saves, if it does
    if saves is not None:
        os.makedirs(saves, exist_ok=True)
    batches = data.batches(batch_size, seed)
    for _ in range(start):  # the batches the saved steps took
        next(batches)
    losses, tokens = [], 0
    started = time.perf_counter()
    for step in range(start + 1, steps + 1):
        batch = next(batches)
        # Dropout's masks come from a generator seeded from the step, so that a resumed run draws the
        # masks the uninterrupted one would have: the random state is (seed, step).
        trainer.seed(seed * 1_000_003 + step)
        if workers == 1:
            losses.append(trainer.step(batch))
        else:
            losses.append(trainer.step(shard(batch, rank, workers), BatchTotals.of(batch)))
        tokens += int(batch["valid_lens"].sum())
        if saves is not None and step % checkpoint_every == 0:
            save_training_state(saves, TrainingState(step, config, model.export_weights(), trainer.state(), settings))
        if on_step:
            on_step(step, losses[-1])
    seconds = time.perf_counter() - started
    return TrainingRun(backend_name, losses, seconds, tokens, model.runtime_info(), model.export_weights(), rank)
