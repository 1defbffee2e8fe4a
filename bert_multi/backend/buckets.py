"""Inputs padded to a few shapes, for a backend that compiles a program for each input shape (JAX).

d2l's BERT computes each sequence of a batch apart from the others, and each prediction apart from the
others, so rows added to a batch, or slots added to ``pred_positions``, leave the outputs of those that
were there as they were; they are cut off after. What is padded, and what never is:

- the batch, to ``bucket(B)`` rows, each of token 0, segment 0, its full length, predicting position 0;
  never in the generations that tile ``valid_lens`` over the heads (d2l <= 0.15), where the length a
  head's row is masked with belongs to a sequence that the batch size picks;
- ``pred_positions``, to ``bucket(P)`` slots, each predicting position 0;
- never the number of steps: a row of valid length 0 attends to every position alike, so what it
  computes depends on how many there are;
- never the kind of an input (``valid_lens`` absent, one per sequence or one per query;
  ``pred_positions`` absent or given), so that a padded batch takes the path through the model's code
  that the batch itself takes, and conformance still checks each path.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numpy as np

from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs, check_inputs
from ..spec.semantics import Semantics
from .contract import BERTOutput

# The least bucket: the cases of a conformance run (batches of 1 to 4, 3 or 4 predictions) share one.
SMALLEST = 4


def bucket(n: int) -> int:
    """The size ``n`` is padded to: the least power of two >= n, and at least ``SMALLEST``. From
    ``SMALLEST`` on, a padded call does less than twice the work of the call asked for."""
    return max(SMALLEST, 1 << (n - 1).bit_length())


class Padded(NamedTuple):
    """Inputs padded to their buckets, and the sizes asked for, which ``cut`` keeps of the outputs."""

    inputs: ModelInputs
    batch_size: int
    num_predictions: int | None  # None: no pred_positions

    def cut(self, output: BERTOutput) -> BERTOutput:
        """The outputs of the rows and prediction slots asked for (every output and activation has the
        batch first)."""
        B, P = self.batch_size, self.num_predictions
        mlm = None if output.mlm is None else output.mlm[:B, :P]
        record = output.intermediates
        if record is not None:
            record = OrderedDict((name, None if a is None else a[:B]) for name, a in record.items())
        nsp = None if output.nsp is None else output.nsp[:B]
        return BERTOutput(output.encoded[:B], mlm, nsp, record)


def padded(inputs: ModelInputs, semantics: Semantics) -> Padded:
    """``inputs`` padded to their buckets where d2l's ``semantics`` leave the outputs asked for as they are."""
    tokens, segments, valid_lens, pred_positions = inputs
    B, T = tokens.shape
    rows = B if semantics.valid_lens_over_heads == "tiled" else bucket(B)

    def grown(array: np.ndarray, shape: tuple[int, ...], fill: int) -> np.ndarray:
        out = np.full(shape, fill, dtype=array.dtype)
        out[tuple(slice(n) for n in array.shape)] = array
        return out

    padded_inputs = ModelInputs(
        grown(tokens, (rows, T), 0),
        grown(segments, (rows, T), 0),
        None if valid_lens is None else grown(valid_lens, (rows, *valid_lens.shape[1:]), T),
        None if pred_positions is None else grown(pred_positions, (rows, bucket(pred_positions.shape[1])), 0),
    )
    return Padded(padded_inputs, B, None if pred_positions is None else pred_positions.shape[1])


def distinct_padded(config: BERTConfig, batches: Iterable[Mapping[str, np.ndarray | None]]) -> list[ModelInputs]:
    """The padded inputs of ``batches`` (checked against ``config``), one of each shape: what a backend
    that pads compiles for them."""
    shapes: dict[tuple[tuple[int, ...] | None, ...], ModelInputs] = {}
    for batch in batches:
        inputs = padded(check_inputs(config, **batch), config.semantics).inputs
        shapes.setdefault(tuple(None if a is None else a.shape for a in inputs), inputs)
    return list(shapes.values())
