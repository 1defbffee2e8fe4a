"""The model's hyper-parameters, validated once, and the built-in configurations."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, cast

from ..errors import UsageError
from .semantics import PRESETS, Semantics, semantics_for

# The arguments of d2l 1.0's BERTModel, in order.
D2L_ARGUMENTS = ("vocab_size", "num_hiddens", "ffn_num_hiddens", "num_heads", "num_blks", "dropout", "max_len")
# The parts after the encoder, each optional: the pooler (Dense + tanh on <cls>), the masked-LM head and
# the next-sentence classifier. A pretraining checkpoint has all three; d2l's fine-tuned BERTClassifier
# keeps the encoder and the pooler only.
HEADS = ("pooler", "mlm", "nsp")
D2LArguments = tuple[int, int, int, int, int, float, int]  # their types
# How a framework's classes compute attention, the same function either way: "d2l", the chapter's
# written-out scores, masked softmax and product (its ``attention_weights`` kept); "sdpa", the
# framework's fused scaled-dot-product kernel, which never materialises the scores (nothing kept).
ATTENTIONS = ("d2l", "sdpa")


@dataclass(frozen=True)
class BERTConfig:
    """Sizes of a d2l BERT model (the arguments of d2l's ``BERTModel``) and what it computes.

    ``dropout`` only matters in training mode; inference never applies it. ``semantics`` is a
    ``Semantics``, a preset name ("d2l", "d2l-0.12", "d2l-0.11") or a d2l version ("0.14.4"); the
    default is d2l 1.0's. ``heads`` are the parts after the encoder that the model has (some of
    ``HEADS``; all by default): a model without a head returns ``None`` for what it cannot compute.
    """

    vocab_size: int
    num_hiddens: int
    ffn_num_hiddens: int
    num_heads: int
    num_blks: int
    dropout: float = 0.0
    max_len: int = 1000
    semantics: Semantics = PRESETS["d2l"]
    heads: tuple[str, ...] = HEADS

    def __post_init__(self) -> None:
        semantics = Semantics.from_dict(self.semantics) if isinstance(self.semantics, dict) else self.semantics
        object.__setattr__(self, "semantics", semantics_for(semantics))
        object.__setattr__(self, "heads", _check_heads(self.heads, self.semantics))
        for name in ("vocab_size", "num_hiddens", "ffn_num_hiddens", "num_heads", "num_blks", "max_len"):
            value = getattr(self, name)
            # bool is an int subclass; True is not a size.
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"BERTConfig.{name} must be an int, got {value!r:.80} ({type(value).__name__})")
            if value < 1:
                raise UsageError(f"BERTConfig.{name} must be a positive int, got {value}")
        if self.num_hiddens % self.num_heads:
            raise UsageError(
                f"BERTConfig.num_hiddens ({self.num_hiddens}) must be divisible by "
                f"num_heads ({self.num_heads}): each head gets num_hiddens / num_heads features"
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise UsageError(f"BERTConfig.dropout must be a number, got {self.dropout!r:.80}")
        if not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"BERTConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.semantics.positions == "sinusoidal" and self.num_hiddens % 2:
            raise UsageError(
                f"BERTConfig.num_hiddens ({self.num_hiddens}) must be even for sinusoidal positions "
                f"(preset {self.semantics.name!r}): the table pairs a sine and a cosine column"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head; the attention scores are scaled by 1/sqrt(head_dim)."""
        return self.num_hiddens // self.num_heads

    def d2l_args(self) -> D2LArguments:
        """The positional arguments of d2l's ``BERTModel(vocab_size, num_hiddens, ffn_num_hiddens,
        num_heads, num_blks, dropout, max_len)``."""
        return cast(D2LArguments, tuple(getattr(self, name) for name in D2L_ARGUMENTS))

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values; the semantics only when they are not the default, so that a
        d2l 1.0 config reads exactly as before generations existed."""
        data: dict[str, Any] = {name: getattr(self, name) for name in D2L_ARGUMENTS}
        if self.semantics != PRESETS["d2l"]:
            data["semantics"] = self.semantics.to_dict()
        if self.heads != HEADS:
            data["heads"] = list(self.heads)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BERTConfig:
        """Inverse of ``to_dict``; unknown or missing keys are a ``ValueError``."""
        if not isinstance(data, dict):
            raise UsageError(f"a BERTConfig needs a dict of its fields, got {type(data).__name__}")
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise UsageError(f"unknown BERTConfig field(s) {unknown}; expected some of {fields}")
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise UsageError(f"BERTConfig is missing field(s) {missing}")
        return cls(**data)

    def with_semantics(self, semantics: Semantics | str) -> BERTConfig:
        """The same sizes computing another generation's semantics."""
        return dataclasses.replace(self, semantics=semantics_for(semantics))


def _check_heads(heads: object, semantics: Semantics) -> tuple[str, ...]:
    """``heads`` as a tuple in ``HEADS`` order, or a ``ValueError`` saying which parts cannot go together."""
    if isinstance(heads, str) or not isinstance(heads, (tuple, list, set, frozenset)):
        raise UsageError(f"BERTConfig.heads must be a tuple of some of {list(HEADS)}, got {heads!r:.80}")
    unknown = [head for head in heads if head not in HEADS]
    if unknown:
        raise UsageError(f"unknown head(s) {unknown} in BERTConfig.heads: expected some of {list(HEADS)}")
    chosen = tuple(head for head in HEADS if head in heads)
    if "nsp" in chosen and "pooler" not in chosen:
        raise UsageError("BERTConfig.heads: the NSP classifier reads the pooler's output, so 'nsp' needs 'pooler'")
    if semantics.nsp_head == "mlp" and ("pooler" in chosen) != ("nsp" in chosen):
        raise UsageError(
            "BERTConfig.heads: in d2l 0.11 the pooler is the first layer of the NSP head; keep both or neither"
        )
    return chosen


# Named configurations: "chapter" is the d2l chapter's demo model, "base" has BERT-base's sizes (with
# d2l's ReLU/post-LN semantics), "tiny" is small enough for fast tests.
CONFIGS: dict[str, BERTConfig] = {
    "tiny": BERTConfig(vocab_size=50, num_hiddens=12, ffn_num_hiddens=20, num_heads=3, num_blks=2, max_len=16),
    "chapter": BERTConfig(vocab_size=10000, num_hiddens=768, ffn_num_hiddens=1024, num_heads=4, num_blks=2),
    "base": BERTConfig(vocab_size=30522, num_hiddens=768, ffn_num_hiddens=3072, num_heads=12, num_blks=12, max_len=512),
}
