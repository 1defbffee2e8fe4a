"""What a gpu-check run found: each part (a check on a backend and GPU) with its result and cost, and the
report of them all, with its verdict, its exit status, and its table, Markdown and JSON."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...display import format_table

PASS, FAIL, SKIP, NOT_RUN = "PASS", "FAIL", "SKIP", "NOT RUN"
EXIT_INCOMPLETE = 3  # the exit status of a run that stopped at its budget with nothing failing


@dataclass
class Part:
    """One check on one backend (or all of them) and GPU: PASS, FAIL, SKIP or NOT RUN, a line for people,
    its data, and what it cost (seconds of wall time; CPU seconds of the whole process, every thread's)."""

    check: str
    backend: str
    device: str
    status: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float | None = None
    cpu_seconds: float | None = None


@dataclass
class GpuReport:
    parts: list[Part]
    environment: dict[str, Any]
    seconds: float = 0.0
    budget: float | None = None
    quick: bool = False

    @property
    def checked(self) -> list[Part]:
        return [part for part in self.parts if part.status in (PASS, FAIL)]

    @property
    def failed(self) -> list[Part]:
        return [part for part in self.parts if part.status == FAIL]

    @property
    def not_run(self) -> list[Part]:
        return [part for part in self.parts if part.status == NOT_RUN]

    def exit_status(self) -> int:
        """1 if a check failed; ``EXIT_INCOMPLETE`` if some did not run; else 0."""
        return 1 if self.failed else EXIT_INCOMPLETE if self.not_run else 0

    def verdict(self) -> str:
        """The one sentence the command ends with."""
        missing = self.not_run
        unrun = f"; {len(missing)} not run ({missing[0].detail}), so nothing is proven of them" if missing else ""
        if self.failed:
            first = self.failed[0]
            return (
                f"FAIL: {len(self.failed)} of {len(self.checked)} GPU checks failed, first {first.check} on "
                f"{first.backend} {first.device}: {first.detail}{unrun}"
            )
        if missing:
            return f"INCOMPLETE: {len(self.checked)} GPU checks passed{unrun}."
        if not self.checked:
            seen = self.environment.get("nvidia-smi") or []
            return "nothing checked on a GPU: " + ("none found" if not seen else "no installed backend can use one")
        gpus = sorted({f"{part.backend} {part.device}" for part in self.checked})
        return f"PASS: all {len(self.checked)} checks on {', '.join(gpus)} conform."

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict(),
            "passed": not self.failed and not self.not_run,
            "seconds": round(self.seconds, 1),
            "budget": self.budget,
            "quick": self.quick,
            "environment": self.environment,
            "parts": [dataclasses.asdict(part) for part in self.parts],
        }

    def table(self) -> str:
        """One row per part: what, where, the result, its time and a line of detail."""

        def took(part: Part) -> str:
            return "-" if part.seconds is None else f"{part.seconds:.1f}"

        rows = [(p.check, p.backend, p.device, p.status, took(p), p.detail) for p in self.parts]
        return format_table(("check", "backend", "device", "result", "s", "detail"), rows)

    def markdown(self) -> str:
        """The summary written beside the JSON report."""
        run = "--quick, " if self.quick else ""
        budget = f"budget {self.budget:g} s" if self.budget is not None else "no budget"
        lines = [
            "# gpu-check",
            "",
            self.verdict(),
            "",
            f"{run}{budget}, {self.seconds:.0f} s.",
            "",
            "```",
            self.table(),
            "```",
            "",
            "## Environment",
            "",
            *(f"- {key}: {value}" for key, value in self.environment.items()),
        ]
        for part in self.parts:
            if part.check == "bench" and part.data.get("table"):
                lines += ["", f"## bench on {part.device}", "", "```", part.data["table"], "```"]
        return "\n".join(lines) + "\n"


def finite(value: float) -> float | None:
    return value if np.isfinite(value) else None  # JSON has no NaN or Infinity
