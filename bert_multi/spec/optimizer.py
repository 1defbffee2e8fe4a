"""What an optimizer's state is, framework-free: the arrays a trainer's ``state()`` returns, a training
state file holds and a worker of another environment sends back, checked the same way everywhere."""

from __future__ import annotations

import numpy as np

from ..arrays import all_finite
from ..errors import WeightsError


def adam_stepped(optimizer: object, step: int) -> bool:
    """Whether a run with ``optimizer`` has taken an Adam step by ``step``: then every parameter has moments."""
    return optimizer == "adam" and step > 0


def check_optimizer_state(
    weights: dict[str, np.ndarray], optimizer: dict[str, np.ndarray], complete: bool = False
) -> None:
    """The optimizer's arrays are Adam's moments ``m.<name>`` and ``v.<name>`` of parameters there are,
    each with its partner, of its parameter's shape and dtype, finite (SGD keeps none), and, where
    ``complete`` (Adam after a step, ``adam_stepped``), those of every parameter; else a ``WeightsError``:
    a resumed run must be the uninterrupted one, not one with made-up or forgotten moments."""
    for key, array in optimizer.items():
        kind, _, name = key.partition(".")
        if kind not in ("m", "v") or name not in weights:
            raise WeightsError(f"optimizer array {key!r} is no moment of a parameter (m.<name> or v.<name>)")
        partner = f"{'v' if kind == 'm' else 'm'}.{name}"
        if partner not in optimizer:
            raise WeightsError(f"optimizer array {key!r} has no partner {partner!r}")
        expected = weights[name]
        if array.shape != expected.shape or array.dtype != expected.dtype:
            raise WeightsError(
                f"optimizer array {key!r} is {array.dtype} {array.shape}; its parameter is {expected.dtype} "
                f"{expected.shape}"
            )
        if not all_finite(array) or (kind == "v" and array.size and array.min() < 0):
            raise WeightsError(f"optimizer array {key!r} holds non-finite values or, as a second moment, negative ones")
    if complete:
        missing = [name for name in weights if f"m.{name}" not in optimizer]
        if missing:
            raise WeightsError(
                f"the optimizer state has no Adam moments for {len(missing)} of the {len(weights)} parameters "
                f"({missing[0]!r} first); after a step Adam holds both moments of every parameter"
            )
