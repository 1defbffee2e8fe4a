"""The model's hyper-parameters, validated once, and the built-in configurations."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BERTConfig:
    """Sizes of a d2l BERT model (the arguments of d2l's ``BERTModel``).

    ``dropout`` only matters in training mode; inference never applies it.
    """

    vocab_size: int
    num_hiddens: int
    ffn_num_hiddens: int
    num_heads: int
    num_blks: int
    dropout: float = 0.0
    max_len: int = 1000

    def __post_init__(self) -> None:
        for name in ("vocab_size", "num_hiddens", "ffn_num_hiddens", "num_heads", "num_blks", "max_len"):
            value = getattr(self, name)
            # bool is an int subclass; True is not a size.
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"BERTConfig.{name} must be an int, got {value!r} ({type(value).__name__})")
            if value < 1:
                raise ValueError(f"BERTConfig.{name} must be a positive int, got {value}")
        if self.num_hiddens % self.num_heads:
            raise ValueError(
                f"BERTConfig.num_hiddens ({self.num_hiddens}) must be divisible by "
                f"num_heads ({self.num_heads}): each head gets num_hiddens / num_heads features"
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise ValueError(f"BERTConfig.dropout must be a number, got {self.dropout!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"BERTConfig.dropout must be in [0, 1), got {self.dropout}")

    @property
    def head_dim(self) -> int:
        """Width of one attention head; the attention scores are scaled by 1/sqrt(head_dim)."""
        return self.num_hiddens // self.num_heads

    def d2l_args(self) -> tuple:
        """The positional arguments of d2l's ``BERTModel(vocab_size, num_hiddens, ffn_num_hiddens,
        num_heads, num_blks, dropout, max_len)``: the fields, in the same order."""
        return dataclasses.astuple(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BERTConfig:
        """Inverse of ``to_dict``; unknown or missing keys are a ``ValueError``."""
        if not isinstance(data, dict):
            raise ValueError(f"a BERTConfig needs a dict of its fields, got {type(data).__name__}")
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ValueError(f"unknown BERTConfig field(s) {unknown}; expected some of {fields}")
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"BERTConfig is missing field(s) {missing}")
        return cls(**data)


# Named configurations: "chapter" is the d2l chapter's demo model, "base" has BERT-base's sizes (with
# d2l's ReLU/post-LN semantics), "tiny" is small enough for fast tests.
CONFIGS: dict[str, BERTConfig] = {
    "tiny": BERTConfig(vocab_size=50, num_hiddens=12, ffn_num_hiddens=20, num_heads=3, num_blks=2, max_len=16),
    "chapter": BERTConfig(vocab_size=10000, num_hiddens=768, ffn_num_hiddens=1024, num_heads=4, num_blks=2),
    "base": BERTConfig(vocab_size=30522, num_hiddens=768, ffn_num_hiddens=3072, num_heads=12, num_blks=12, max_len=512),
}
