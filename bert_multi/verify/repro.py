"""``verify --save-repro``: what shows a failing check with NumPy alone, for a bug report or a notebook: the
weights, the inputs, the oracle's and the user's outputs and activations, and a script that prints the
first divergence."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from ..backend.oracle import build as build_oracle
from ..engine.cases import get_case
from ..engine.results import OUTPUT_NAMES
from ..safe_files import replace_arrays, replace_text, written_together
from ..spec.schema import cut_max_len
from ..spec.weight_file import save_weights
from .user import Given, UserBackend

SCRIPT = '''"""A failing check of bert_multi's verify, reproduced (``TITLE`` says which).

Run it with NumPy alone, from anywhere: python repro.py (exit status 1 when it shows a divergence).
weights.npz beside it holds the canonical weights (bert_multi's format: plain .npy members), inputs.npz
the batch, reference.npz the float64 oracle's outputs and activations, yours.npz your model's, in the
order they are computed."""

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TITLE = {title}  # the model's name as the user gave it, quoted: never code
ORDER = {order}
WHERE = {where}
ATOL, RTOL = {atol!r}, {rtol!r}  # the tolerance of this check


def first_divergence():
    """The first activation or output outside the tolerance, as lines to print; None if there is none."""
    reference, yours = np.load(HERE / "reference.npz"), np.load(HERE / "yours.npz")
    for name in ORDER:
        if name not in yours.files:
            return [f"{{name}}: your model has no value for it"]
        got, expected = yours[name].astype(np.float64), reference[name]
        if got.shape != expected.shape:
            return [f"{{name}}: shape {{got.shape}}, expected {{expected.shape}}"]
        error = np.abs(got - expected)
        bad = ~np.isfinite(got) | (error > ATOL + RTOL * np.abs(expected))
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            return [
                f"first divergence: {{name}} ({{WHERE.get(name, 'an output')}}), "
                f"max abs error {{np.nanmax(error):.3g}}",
                f"first element outside the tolerance: {{index}}, yours {{float(got[index])!r}}, "
                f"expected {{float(expected[index])!r}}",
            ]
    return None


if __name__ == "__main__":
    found = first_divergence()
    print(TITLE)
    print("\\n".join(found or ["no divergence: every activation and output is within the tolerance"]))
    sys.exit(1 if found else 0)
'''


def save_repro(report: Any, factory: Any, weights: dict[str, np.ndarray], directory: str | Path) -> Path:
    """Write the reproduction of ``report``'s first failing forward check into ``directory``."""
    check = report.forward.failures()[0]
    case = get_case(check.case).input(report.config, report.seed)
    config, cut = cut_max_len(report.config, weights, case.max_len) if case.max_len else (report.config, weights)
    backend = UserBackend(Given.of(factory, report.label), report.map_file, report.mapping)
    yours = backend.build(config, cut, check.target.device, check.target.dtype)(**case.batch, intermediates=True)
    expected = build_oracle(config, cut, dtype="float64")(**case.batch, intermediates=True)
    names = [name for name in (yours.intermediates or {}) if name in (expected.intermediates or {})]
    order = names + [name for name in OUTPUT_NAMES if getattr(expected, name) is not None]

    def arrays(out: Any) -> OrderedDict[str, np.ndarray]:
        found = OrderedDict((name, (out.intermediates or {}).get(name)) for name in names)
        found.update((name, getattr(out, name)) for name in OUTPUT_NAMES)
        return OrderedDict((name, value) for name, value in found.items() if value is not None)

    tolerance = check.outputs[0].tolerance
    title = f"{report.label} against the oracle: case {check.case}, {check.target.dtype} on {check.target.device}."
    where = {name: report.user_name(name) for name in names}
    text = SCRIPT.format(
        title=repr(title), order=repr(order), where=repr(where), atol=tolerance.atol, rtol=tolerance.rtol
    )
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    with written_together():  # the script and its arrays are of one failure: never one beside another's
        save_weights(path / "weights.npz", config, cut)
        for name, contents in (
            ("inputs.npz", {k: v for k, v in case.batch.items() if v is not None}),
            ("reference.npz", arrays(expected)),
            ("yours.npz", arrays(yours)),
        ):
            replace_arrays(path / name, contents)
        replace_text(path / "repro.py", text)
    return path
