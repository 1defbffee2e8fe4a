"""The constructor signatures of d2l's earlier generations, translated to the 1.0 classes.

Each class here is a mixin that only translates arguments. A framework's ``d2l_0_11``, ``d2l_0_12``
and ``d2l_0_17`` modules put one in front of that framework's own class, for example
``class EncoderBlock(generations.GluonStyleEncoderBlock, model.TransformerEncoderBlock)`` with
``preset = "d2l-0.11"``, so old code can switch its import and keep working, and no model code is
written twice.

Two signature styles existed: d2l's MXNet code up to 0.17 (``num_layers``, input widths inferred),
which the PyTorch twins of 0.11 and 0.12 share, and d2l 0.16-0.17's PyTorch code, which spells out
every input width (``key_size``, ``norm_shape``, ``ffn_num_input``, ``hid_in_features`` ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import UsageError
from .semantics import Semantics, semantics_for

T = TypeVar("T")


class Generation:
    """What a generation's adapters set: the preset they compute, and whether the positional embedding
    trains (d2l 0.16-0.17's PyTorch code added ``pos_embedding.data``, so it did not)."""

    preset = "d2l"
    train_positions = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # A mixin: the framework's class after it takes the translated arguments.
        super().__init__(*args, **kwargs)

    @property
    def _switches(self) -> Semantics:
        return semantics_for(self.preset)


class _Arguments:
    """The end of a translation: keeps the arguments a mixin passes on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


def constructor(
    mixin: type[Generation], target: Callable[..., T], preset: str, train_positions: bool = True
) -> Callable[..., T]:
    """A function taking ``mixin``'s signature and returning ``target`` built from the translated arguments:
    the adapter for a framework whose classes cannot take a mixin's ``__init__`` (Flax modules are
    dataclasses, their fields the constructor)."""
    translate = type(mixin.__name__, (mixin, _Arguments), {"preset": preset, "train_positions": train_positions})

    def build(*args: Any, **kwargs: Any) -> T:
        translated = translate(*args, **kwargs)
        return target(*translated.args, **translated.kwargs)

    build.__name__ = build.__qualname__ = mixin.__name__.removeprefix("GluonStyle").removeprefix("Sized")
    build.__doc__ = (
        f"{mixin.__doc__}\n\nBuilds a {getattr(target, '__name__', target)} computing the preset {preset!r}."
    )
    return build


# --- d2l's MXNet signatures (0.11 to 0.17), shared by the PyTorch twins of 0.11 and 0.12 ----------------


class GluonStyleMultiHeadAttention(Generation):
    """``MultiHeadAttention(num_hiddens, num_heads, dropout, use_bias=False)`` (0.11 had no use_bias)."""

    def __init__(self, num_hiddens: int, num_heads: int, dropout: float, use_bias: bool = False, **kwargs) -> None:
        over_heads = self._switches.valid_lens_over_heads
        super().__init__(num_hiddens, num_heads, dropout, use_bias, valid_lens_over_heads=over_heads, **kwargs)


class GluonStyleEncoderBlock(Generation):
    """``EncoderBlock(num_hiddens, ffn_num_hiddens, num_heads, dropout, use_bias=False)``."""

    def __init__(
        self, num_hiddens: int, ffn_num_hiddens: int, num_heads: int, dropout: float, use_bias: bool = False
    ) -> None:
        over_heads = self._switches.valid_lens_over_heads
        super().__init__(num_hiddens, ffn_num_hiddens, num_heads, dropout, use_bias, over_heads)


class GluonStyleBERTEncoder(Generation):
    """``BERTEncoder(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_layers, dropout, max_len=1000)``
    (0.11 had no max_len: its sinusoidal table has 1000 rows)."""

    def __init__(
        self,
        vocab_size: int,
        num_hiddens: int,
        ffn_num_hiddens: int,
        num_heads: int,
        num_layers: int,
        dropout: float,
        max_len: int = 1000,
        **kwargs,
    ) -> None:
        super().__init__(
            vocab_size,
            num_hiddens,
            ffn_num_hiddens,
            num_heads,
            num_layers,
            dropout,
            max_len,
            semantics=self.preset,
            train_positions=self.train_positions,
            **kwargs,
        )


class GluonStyleBERTModel(GluonStyleBERTEncoder):
    """``BERTModel(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_layers, dropout, max_len=1000)``:
    the encoder's signature, translated the same way."""


# --- d2l 0.16-0.17's PyTorch signatures: every input width spelled out --------------------------------


def same_width(num_hiddens: int, **widths: object) -> None:
    """The 0.17 widths must all be ``num_hiddens``: BERT's layers read and write vectors of that width,
    and so do bert_multi's (an inconsistent set would fail in d2l too, at the first forward)."""
    for name, width in widths.items():
        value = list(width) if isinstance(width, (list, tuple)) else width
        if value not in (num_hiddens, [num_hiddens]):
            raise UsageError(f"{name}={width!r}, but BERT's blocks read and write num_hiddens={num_hiddens} features")


class SizedMultiHeadAttention(GluonStyleMultiHeadAttention):
    """``MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads, dropout, bias=False)``."""

    def __init__(
        self,
        key_size: int,
        query_size: int,
        value_size: int,
        num_hiddens: int,
        num_heads: int,
        dropout: float,
        bias: bool = False,
        **kwargs,
    ) -> None:
        same_width(query_size, key_size=key_size, value_size=value_size)
        super().__init__(num_hiddens, num_heads, dropout, bias, num_inputs=query_size, **kwargs)


class SizedEncoderBlock(GluonStyleEncoderBlock):
    """``EncoderBlock(key_size, query_size, value_size, num_hiddens, norm_shape, ffn_num_input,
    ffn_num_hiddens, num_heads, dropout, use_bias=False)``."""

    def __init__(
        self,
        key_size: int,
        query_size: int,
        value_size: int,
        num_hiddens: int,
        norm_shape,
        ffn_num_input: int,
        ffn_num_hiddens: int,
        num_heads: int,
        dropout: float,
        use_bias: bool = False,
    ) -> None:
        widths = dict(key_size=key_size, query_size=query_size, value_size=value_size, ffn_num_input=ffn_num_input)
        same_width(num_hiddens, norm_shape=norm_shape, **widths)
        super().__init__(num_hiddens, ffn_num_hiddens, num_heads, dropout, use_bias)


class SizedBERTEncoder(GluonStyleBERTEncoder):
    """``BERTEncoder(vocab_size, num_hiddens, norm_shape, ffn_num_input, ffn_num_hiddens, num_heads,
    num_layers, dropout, max_len=1000, key_size=768, query_size=768, value_size=768)``."""

    def __init__(
        self,
        vocab_size: int,
        num_hiddens: int,
        norm_shape,
        ffn_num_input: int,
        ffn_num_hiddens: int,
        num_heads: int,
        num_layers: int,
        dropout: float,
        max_len: int = 1000,
        key_size: int = 768,
        query_size: int = 768,
        value_size: int = 768,
        **kwargs,
    ) -> None:
        widths = dict(key_size=key_size, query_size=query_size, value_size=value_size, ffn_num_input=ffn_num_input)
        same_width(num_hiddens, norm_shape=norm_shape, **widths)
        super().__init__(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_layers, dropout, max_len, **kwargs)


class SizedMaskLM(Generation):
    """``MaskLM(vocab_size, num_hiddens, num_inputs=768)``."""

    def __init__(self, vocab_size: int, num_hiddens: int, num_inputs: int = 768, **kwargs) -> None:
        super().__init__(vocab_size, num_hiddens, num_inputs, **kwargs)


class SizedBERTModel(GluonStyleBERTModel):
    """``BERTModel(vocab_size, num_hiddens, norm_shape, ffn_num_input, ffn_num_hiddens, num_heads,
    num_layers, dropout, max_len=1000, key_size=768, query_size=768, value_size=768,
    hid_in_features=768, mlm_in_features=768, nsp_in_features=768)``."""

    def __init__(
        self,
        vocab_size: int,
        num_hiddens: int,
        norm_shape,
        ffn_num_input: int,
        ffn_num_hiddens: int,
        num_heads: int,
        num_layers: int,
        dropout: float,
        max_len: int = 1000,
        key_size: int = 768,
        query_size: int = 768,
        value_size: int = 768,
        hid_in_features: int = 768,
        mlm_in_features: int = 768,
        nsp_in_features: int = 768,
    ) -> None:
        widths = dict(key_size=key_size, query_size=query_size, value_size=value_size, ffn_num_input=ffn_num_input)
        features = dict(
            hid_in_features=hid_in_features, mlm_in_features=mlm_in_features, nsp_in_features=nsp_in_features
        )
        same_width(num_hiddens, norm_shape=norm_shape, **widths, **features)
        super().__init__(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_layers, dropout, max_len)
