"""The canonical parameter schema: every weight's name, shape and role, in one table.

Names are the keys of d2l 1.0's PyTorch ``BERTModel.state_dict()``, in that order. Dense weights are
(out, in), as in both ``torch.nn.Linear`` and ``gluon.nn.Dense``. Backends map these names to their
own structural names; nothing else in the project spells them out.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Literal, NamedTuple

import numpy as np

from ..arrays import all_finite, first_index
from ..errors import UsageError, WeightsError
from .config import BERTConfig

SUPPORTED_DTYPES = ("float32", "float64")
SEGMENTS = 2  # the segment embedding's rows: sentence A and B (segment ids 0 and 1)

# "tied_embedding": the token embedding when it is also the MLM decoder's weight (original BERT).
Role = Literal["embedding", "tied_embedding", "dense_weight", "bias", "ln_gamma", "ln_beta"]


class ParamSpec(NamedTuple):
    shape: tuple[int, ...]
    role: Role


def iter_param_specs(config: BERTConfig) -> Iterator[tuple[str, ParamSpec]]:
    """The canonical schema, name by name, in order, without building it whole (a file's config is
    checked against what the file holds before a schema of its size is built). Names and shapes follow
    ``config.semantics``: the canonical names are those of the PyTorch model of that generation."""
    H, F, V = config.num_hiddens, config.ffn_num_hiddens, config.vocab_size
    semantics = config.semantics

    def dense(prefix: str, n_out: int, n_in: int, bias: bool = True) -> Iterator[tuple[str, ParamSpec]]:
        yield f"{prefix}.weight", ParamSpec((n_out, n_in), "dense_weight")
        if bias:
            yield f"{prefix}.bias", ParamSpec((n_out,), "bias")

    def layer_norm(prefix: str) -> Iterator[tuple[str, ParamSpec]]:
        yield f"{prefix}.weight", ParamSpec((H,), "ln_gamma")
        yield f"{prefix}.bias", ParamSpec((H,), "ln_beta")

    def mask_lm() -> Iterator[tuple[str, ParamSpec]]:
        yield from dense("mlm.mlp.0", H, H)
        yield from layer_norm("mlm.mlp.2")
        if semantics.mlm_decoder == "own":
            yield from dense("mlm.mlp.3", V, H)
        else:  # tied to the token embedding: only the decoder's bias is its own
            yield "mlm.mlp.3.bias", ParamSpec((V,), "bias")

    # torch's state_dict lists a module's own parameters before its children's, so a learned
    # positional embedding (a bare nn.Parameter of the encoder) comes first; a sinusoidal table is none.
    if semantics.positions == "learned":
        yield "encoder.pos_embedding", ParamSpec((1, config.max_len, H), "embedding")
    tied = semantics.mlm_decoder == "tied" and "mlm" in config.heads
    yield "encoder.token_embedding.weight", ParamSpec((V, H), "tied_embedding" if tied else "embedding")
    yield "encoder.segment_embedding.weight", ParamSpec((SEGMENTS, H), "embedding")
    if semantics.embedding_norm:
        yield from layer_norm("encoder.embedding_norm")
    for i in range(config.num_blks):
        blk = f"encoder.blks.{i}"
        for projection in ("W_q", "W_k", "W_v", "W_o"):
            yield from dense(f"{blk}.attention.{projection}", H, H, bias=semantics.attention_bias)
        yield from layer_norm(f"{blk}.addnorm1.ln")
        yield from dense(f"{blk}.ffn.dense1", F, H)
        yield from dense(f"{blk}.ffn.dense2", H, F)
        yield from layer_norm(f"{blk}.addnorm2.ln")
    pooler, classifier = nsp_layers(config)
    heads = config.heads
    if semantics.nsp_head == "pooler":  # BERTModel registers encoder, hidden, mlm, nsp
        if "pooler" in heads:
            yield from dense(pooler, H, H)
        if "mlm" in heads:
            yield from mask_lm()
        if "nsp" in heads:
            yield from dense(classifier, 2, H)
    else:  # d2l 0.11's BERTModel registers encoder, nsp (which holds the pooler), mlm
        if "nsp" in heads:
            yield from dense(pooler, H, H)
            yield from dense(classifier, 2, H)
        if "mlm" in heads:
            yield from mask_lm()


def nsp_layers(config: BERTConfig) -> tuple[str, str]:
    """Where the NSP path's two dense layers live: the pooler (Dense + tanh on <cls>) and the classifier
    (Dense(2)). The computation is the same in every generation; the layers moved."""
    if config.semantics.nsp_head == "pooler":  # d2l >= 0.12: BERTModel.hidden, then NextSentencePred.output
        return "hidden.0", "nsp.output"
    return "nsp.mlp.0", "nsp.mlp.2"  # d2l 0.11: NextSentencePred's own MLP reads <cls>


def head_of(config: BERTConfig, name: str) -> str | None:
    """The part after the encoder that the canonical tensor ``name`` belongs to ("pooler", "mlm" or "nsp",
    of ``HEADS``), or None for one of the encoder's."""
    pooler, classifier = nsp_layers(config)
    for head, prefix in (("pooler", pooler), ("nsp", classifier), ("mlm", "mlm")):
        if name.startswith(prefix + "."):
            return head
    return None


def without_heads(config: BERTConfig, absent: Iterable[str]) -> BERTConfig:
    """``config`` without the ``absent`` parts, and the NSP classifier too where its pooler is absent (it
    reads the pooler's output; in d2l 0.11 the two are one head)."""
    gone = set(absent)
    if "pooler" in gone or (config.semantics.nsp_head == "mlp" and "nsp" in gone):
        gone |= {"pooler", "nsp"}
    return dataclasses.replace(config, heads=tuple(head for head in config.heads if head not in gone))


def param_specs(config: BERTConfig) -> dict[str, ParamSpec]:
    """Ordered canonical schema with each tensor's role (what kind of initialisation it gets)."""
    return dict(iter_param_specs(config))


def param_shapes(config: BERTConfig) -> dict[str, tuple[int, ...]]:
    """Ordered canonical schema: name -> shape. The one source of truth for weight names and shapes."""
    return {name: spec.shape for name, spec in param_specs(config).items()}


def param_shapes_within(config: BERTConfig, count: int) -> dict[str, tuple[int, ...]]:
    """The schema's first ``count + 1`` names and shapes at most: enough to tell that ``count`` tensors do
    not match a larger config, without building a schema of its size (a file may claim 10**9 blocks)."""
    return {name: spec.shape for name, spec in itertools.islice(iter_param_specs(config), count + 1)}


def cut_max_len(
    config: BERTConfig, weights: dict[str, np.ndarray], max_len: int
) -> tuple[BERTConfig, dict[str, np.ndarray]]:
    """The model that knows only the first ``max_len`` positions: its config, and views of ``weights`` cut
    to that config's schema (a learned positional table loses its later rows; nothing else changes)."""
    if max_len == config.max_len:
        return config, weights
    if not 1 <= max_len <= config.max_len:
        raise UsageError(f"cannot cut a model of max_len {config.max_len} to max_len {max_len}")
    cut = dataclasses.replace(config, max_len=max_len)
    shapes = param_shapes(cut)
    return cut, {name: array[tuple(slice(n) for n in shapes[name])] for name, array in weights.items()}


def normalize_dtype(dtype: object) -> str:
    """'float32' or 'float64' from a string or NumPy dtype; anything else is a ``ValueError``."""
    try:
        name = np.dtype(dtype).name  # type: ignore[call-overload]
    except TypeError:
        name = repr(dtype)
    if name not in SUPPORTED_DTYPES:
        raise UsageError(f"unsupported dtype {dtype!r}: expected one of {SUPPORTED_DTYPES}")
    return name


def _draw(
    config: BERTConfig, seed: int, dtype: object, scale: Callable[[ParamSpec, np.ndarray], np.ndarray]
) -> dict[str, np.ndarray]:
    """One standard-normal draw per tensor, in schema order from one seeded generator, scaled by role."""
    dtype = normalize_dtype(dtype)
    rng = np.random.default_rng(seed)
    return {
        name: scale(spec, rng.standard_normal(spec.shape)).astype(dtype, copy=False)
        for name, spec in param_specs(config).items()
    }


def init_weights(config: BERTConfig, seed: int = 0, dtype: object = "float32") -> dict[str, np.ndarray]:
    """Deterministic, framework-free initial weights, as BERT starts training.

    Embeddings and dense weights are N(0, 0.02^2), biases and LayerNorm beta zero, LayerNorm gamma one.
    Every backend loads these same numbers, so no framework initialiser is ever relied on.
    """

    def bert_init(spec: ParamSpec, z: np.ndarray) -> np.ndarray:
        if spec.role in ("embedding", "tied_embedding", "dense_weight"):
            return 0.02 * z
        return np.full(spec.shape, 1.0 if spec.role == "ln_gamma" else 0.0)

    return _draw(config, seed, dtype, bert_init)


def random_weights(config: BERTConfig, seed: int = 0, dtype: object = "float32") -> dict[str, np.ndarray]:
    """Weights in which every tensor is random, for conformance testing.

    With ``init_weights`` the biases are zero and the gammas one, so a backend that dropped a bias or
    swapped LayerNorm's gamma and beta would still agree. Here biases, gammas and betas are drawn too,
    and dense weights have std 1/sqrt(fan_in) so that activations stay of order one in every layer.
    """

    def all_random(spec: ParamSpec, z: np.ndarray) -> np.ndarray:
        # Scaled in place: the same operations as z / c or 1 + 0.1 z, so the same numbers, without a
        # temporary the size of BERT-base's embedding.
        if spec.role == "embedding":
            return z
        # A tied token embedding is the decoder's weight too: scaled like one, its logits stay of order
        # one (unit-variance rows over H features would make them of order sqrt(H), 28 at BERT-base).
        if spec.role in ("dense_weight", "tied_embedding"):
            z /= np.sqrt(spec.shape[1])
            return z
        z *= 0.1  # biases and LayerNorm betas
        if spec.role == "ln_gamma":
            z += 1.0
        return z

    return _draw(config, seed, dtype, all_random)


def check_names(shapes: dict[str, tuple[int, ...]], names: Iterable[str]) -> None:
    """``WeightsError`` unless ``names`` are exactly the schema's (a set or dict, for fast lookups)."""
    missing = [name for name in shapes if name not in names]
    extra = [name for name in names if name not in shapes]

    def listed(found: list[str]) -> str:
        return f"{found[:5]}{f' and {len(found) - 5} more' if len(found) > 5 else ''}"

    parts = [f"missing tensor(s) {listed(missing)} of the config's schema"] if missing else []
    parts += [f"unexpected tensor(s) {listed(extra)} not in the canonical schema for this config"] if extra else []
    if parts:  # both at once: a block of another number is missing under one name and unexpected under another
        raise WeightsError("; ".join(parts))


def validate_weights(config: BERTConfig, weights: object) -> str:
    """Check a weight dict against the schema; return its dtype name ('float32' or 'float64').

    Every tensor must be present, nothing extra, each a finite NumPy array of the schema's shape, all of
    one supported floating dtype. A violation is a ``WeightsError`` naming the tensor.
    """
    if not isinstance(weights, Mapping):
        raise WeightsError(f"weights must be a dict of name -> numpy array, got {type(weights).__name__}")
    shapes = param_shapes_within(config, len(weights))
    check_names(shapes, dict.fromkeys(weights))  # the names alone: a mapping may read a tensor to find one
    common_dtype = None
    for name, expected_shape in shapes.items():
        array = weights[name]
        if not isinstance(array, np.ndarray):
            raise WeightsError(f"tensor {name!r} must be a numpy.ndarray, got {type(array).__name__}")
        if isinstance(array, np.ma.MaskedArray):
            raise WeightsError(
                f"tensor {name!r} is a masked array; a mask means nothing to a model: pass array.filled() "
                "or np.asarray(array)"
            )
        if array.dtype.name not in SUPPORTED_DTYPES:
            raise WeightsError(f"tensor {name!r} has dtype {array.dtype}, expected one of {SUPPORTED_DTYPES}")
        if common_dtype is None:
            common_dtype = array.dtype.name
        elif array.dtype.name != common_dtype:
            raise WeightsError(f"tensor {name!r} has dtype {array.dtype}, expected {common_dtype} like the others")
        if array.shape != expected_shape:
            raise WeightsError(f"tensor {name!r} has shape {array.shape}, expected {expected_shape}")
        if not all_finite(array):
            bad = first_index(~np.isfinite(array))
            raise WeightsError(f"tensor {name!r} has a non-finite value {array[bad]} at index {bad}")
    assert common_dtype is not None  # the schema is never empty
    return common_dtype
