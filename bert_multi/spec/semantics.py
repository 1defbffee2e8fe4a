"""What the model computes: a few switches, and each d2l generation as a named preset of them.

d2l's BERT changed between releases (docs/checkpoints.md, "d2l's generations"). Each switch below says which release
each of its values reproduces. A ``BERTConfig`` carries one ``Semantics``: the schema derives names
and shapes from it, the oracle has one visible branch per switch, and each framework's classes read
it in their constructors.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import UsageError


@dataclass(frozen=True)
class Semantics:
    """The switches that tell d2l's generations apart; the defaults are d2l 1.0's."""

    positions: str = "learned"
    """"learned": a (1, max_len, H) parameter added to the embeddings (d2l >= 0.12); "sinusoidal": a
    fixed sin/cos table added, then dropout (d2l 0.11's ``d2l.PositionalEncoding``)."""

    attention_bias: bool = True
    """Whether W_q, W_k, W_v and W_o have biases: d2l >= 0.12's BERT asks for them; 0.11's have none."""

    valid_lens_over_heads: str = "interleaved"
    """How valid_lens are copied over the heads: "interleaved" (b0, b0, ..., b1, b1, ...) matches the
    head layout (d2l >= 0.16); "tiled" (b0, b1, ..., b0, b1, ...) is d2l <= 0.15's bug, reproduced."""

    nsp_head: str = "pooler"
    """"pooler": ``hidden`` (Dense + tanh on <cls>) in BERTModel, then ``nsp.output`` Dense(2) (d2l >=
    0.12); "mlp": the NSP head reads <cls> itself, ``nsp.mlp`` = Dense(H, tanh), Dense(2) (d2l 0.11)."""

    embedding_norm: bool = False
    """Whether a LayerNorm (then dropout) follows the embedding sum: original BERT's (``bert``); d2l has none."""

    activation: str = "relu"
    """The nonlinearity of the FFN and the MLM transform: "relu" (d2l); "gelu", exact erf form
    x * Phi(x) (original BERT); "gelu_tanh", its tanh approximation (some BERT checkpoints)."""

    layer_norm_eps: float = 1e-5
    """Every LayerNorm's epsilon: 1e-5, both frameworks' default (d2l); 1e-12 in original BERT."""

    mlm_decoder: str = "own"
    """The MLM head's last layer: "own", a Dense(V) of its own (d2l, ``mlm.mlp.3``); "tied", the token
    embedding's weight plus its own bias ``mlm.mlp.3.bias`` (original BERT)."""

    def __post_init__(self) -> None:
        for field, allowed in CHOICES.items():
            value = getattr(self, field)
            if value not in allowed or type(value) is not type(allowed[0]):
                raise UsageError(f"Semantics.{field} is {value!r:.80}; expected one of {list(allowed)}")
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise UsageError(f"Semantics.layer_norm_eps is {eps!r:.80}; expected a number in (0, 1)")
        object.__setattr__(self, "layer_norm_eps", float(eps))

    def __repr__(self) -> str:
        # A preset reads as its name, which BERTConfig(semantics=...) accepts.
        if self.name != "custom":
            return repr(self.name)
        return f"Semantics({', '.join(f'{key}={value!r}' for key, value in self.to_dict().items())})"

    @property
    def name(self) -> str:
        """The preset these switches make, or "custom"."""
        return next((name for name, preset in PRESETS.items() if preset == self), "custom")

    def to_dict(self) -> dict[str, Any]:
        # The switches added after weight-file format version 2 appear only where they differ from d2l's:
        # a d2l generation's file reads as before, and a release that predates them refuses one using them.
        defaults = Semantics()
        return {
            name: value
            for name, value in dataclasses.asdict(self).items()
            if name in FIRST_SWITCHES or value != getattr(defaults, name)
        }

    @classmethod
    def from_dict(cls, data: object) -> Semantics:
        """Inverse of ``to_dict``; unknown or missing switches are a ``ValueError``."""
        switches = [field.name for field in dataclasses.fields(cls)]
        if not isinstance(data, dict) or not set(FIRST_SWITCHES) <= set(data) or not set(data) <= set(switches):
            raise UsageError(f"semantics must be a dict of the switches {switches}, got {data!r:.200}")
        return cls(**data)


# The switches of weight-file format version 2; a later one, absent from a file, is d2l's.
FIRST_SWITCHES = ("positions", "attention_bias", "valid_lens_over_heads", "nsp_head")
CHOICES: dict[str, tuple] = {
    "positions": ("learned", "sinusoidal"),
    "attention_bias": (True, False),
    "valid_lens_over_heads": ("interleaved", "tiled"),
    "nsp_head": ("pooler", "mlp"),
    "embedding_norm": (False, True),
    "activation": ("relu", "gelu", "gelu_tanh"),
    "mlm_decoder": ("own", "tied"),
}

PRESETS: dict[str, Semantics] = {
    "d2l": Semantics(),
    "d2l-0.12": Semantics(valid_lens_over_heads="tiled"),
    "d2l-0.11": Semantics(positions="sinusoidal", attention_bias=False, valid_lens_over_heads="tiled", nsp_head="mlp"),
    # Devlin et al.'s BERT as HuggingFace's BertModel computes it (docs/original-bert.md).
    "bert": Semantics(embedding_norm=True, activation="gelu", layer_norm_eps=1e-12, mlm_decoder="tied"),
}
# The first and last d2l release each preset reproduces (read from the released packages, d2l==X
# --no-deps), and those whose BERT was MXNet only. Both the version lookup and the labels come from here.
RELEASES: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "d2l-0.11": ((0, 11), (0, 11)),
    "d2l-0.12": ((0, 12), (0, 15)),
    "d2l": ((0, 16), (1, 0)),
}
MXNET_ONLY = ("d2l-0.11", "d2l-0.12")
# Every d2l release since BERT's chapter, as PyPI lists them: a version that is none of these was never
# released, whatever preset its number would fall in.
D2L_RELEASES = (
    *("0.11.0", "0.11.1", "0.11.2", "0.11.3", "0.11.4", "0.12.0", "0.13.0", "0.13.1", "0.13.2"),
    *("0.14.0", "0.14.1", "0.14.2", "0.14.3", "0.14.4", "0.15.0", "0.15.1"),
    *("0.16.0", "0.16.1", "0.16.2", "0.16.3", "0.16.4", "0.16.5", "0.16.6", "0.16.7"),
    *("0.17.0", "0.17.1", "0.17.2", "0.17.3", "0.17.4", "0.17.5", "0.17.6", "1.0.0", "1.0.1", "1.0.2", "1.0.3"),
)


def releases_of(preset: str, framework: str | None = None) -> str:
    """What a preset reproduces, for people: "d2l 0.12 - 0.15 (MXNet)", or the original BERT; for a file
    of ``framework``, in its terms (a generation d2l published for MXNet only is, in another framework's
    file, that generation's computation ported to it)."""
    if preset not in RELEASES:
        return "the original BERT (Devlin et al. 2018; HuggingFace's BertModel)"
    first, last = (".".join(map(str, version)) for version in RELEASES[preset])
    span = first if first == last else f"{first} - {last}"
    if preset not in MXNET_ONLY:
        return f"d2l {span}"
    if framework in (None, "mxnet"):
        return f"d2l {span} (MXNet)"
    return f"d2l {span}'s computation, ported: d2l published that generation for MXNet only"


def described(semantics: Semantics, framework: str | None = None) -> str:
    """What switches compute, for people: a preset's releases (``releases_of``), or for switches no preset
    has, the nearest preset's and what differs ("the original BERT (...) with mlm_decoder='own'")."""
    if semantics.name != "custom":
        return releases_of(semantics.name, framework)
    switches = dataclasses.asdict(semantics)

    def differing(name: str) -> dict[str, Any]:
        return {key: value for key, value in switches.items() if getattr(PRESETS[name], key) != value}

    nearest = min(PRESETS, key=lambda name: len(differing(name)))
    changed = ", ".join(f"{key}={value!r}" for key, value in differing(nearest).items())
    return f"{releases_of(nearest, framework)} with {changed}"


def semantics_for(spec: str | Semantics) -> Semantics:
    """A preset by name ("d2l-0.11"), or the preset of a d2l release, however pip or a person writes it
    ("0.14.4", "d2l==1.0.3", "d2l-1.0", "d2l 0.17", "v1.0.3")."""
    if isinstance(spec, Semantics):
        return spec
    if not isinstance(spec, str):
        raise UsageError(f"a preset is a name {list(PRESETS)} or a d2l version, got {spec!r:.80}")
    if spec in PRESETS:
        return PRESETS[spec]
    match = re.fullmatch(r"(?:d2l\s*(?:==|-|\s)\s*)?v?(\d{1,4}(?:\.\d{1,4}){1,3})(?:\.?post\d+)?", spec.strip().lower())
    if not match:
        raise UsageError(
            f"unknown preset {spec!r:.80}: expected one of {list(PRESETS)} or a d2l version such as '0.14.4'"
        )
    parts = match[1].split(".")
    released = [release for release in D2L_RELEASES if release.split(".")[: len(parts)] == parts[:3]]
    if not released or len(parts) > 3:
        raise UsageError(
            f"d2l {match[1]} is no release with BERT's chapter (never released, or before it arrived in "
            f"{D2L_RELEASES[0]}); {covered()}"
        )
    version = (int(parts[0]), int(parts[1]))
    # The newest preset whose first release is not after this one.
    starts = sorted((first, name) for name, (first, _) in RELEASES.items())
    return PRESETS[[name for first, name in starts if first <= version][-1]]


def covered() -> str:
    """The releases each generation covers, for a message: "the releases with BERT are 0.11.0 - 0.11.4
    (preset d2l-0.11), ..."."""
    spans = []
    for name, (first, last) in sorted(RELEASES.items(), key=lambda item: item[1]):
        inside = [r for r in D2L_RELEASES if first <= tuple(map(int, r.split(".")[:2])) <= last]
        spans.append(f"{inside[0]} - {inside[-1]} (preset {name})")
    return "the releases with BERT's chapter are " + ", ".join(spans)


def sinusoidal_positions(max_len: int, num_hiddens: int) -> np.ndarray:
    """The fixed table of d2l's ``PositionalEncoding``, (max_len, num_hiddens) in float64:
    P[pos, 2i] = sin(pos / 10000^(2i/H)), P[pos, 2i+1] = cos(pos / 10000^(2i/H))."""
    if num_hiddens % 2:
        raise UsageError(f"sinusoidal positions need an even num_hiddens (sin and cos pair up), got {num_hiddens}")
    angles = np.arange(max_len)[:, None] / np.power(10000.0, np.arange(0, num_hiddens, 2) / num_hiddens)
    table = np.empty((max_len, num_hiddens))
    table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
    return table
