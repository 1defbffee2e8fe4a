"""``bert-multi gpu-check``: everything this project checks on a GPU, in one offline command that runs from
a source tree with nothing installed, for every GPU found and every installed backend that can use it.

Per backend and GPU: conformance of every preset against the float64 oracle, in float32 (TF32 off) and
float64, with GPU-vs-CPU pairs of the same framework; the golden fixtures; what TF32 does (the same
float32 run with it on, and that the report records the setting); gradients and a few pretraining steps
on the GPU against the CPU from the same weights and batches; and ``bench`` on the GPU. A backend with no
GPU here, or a GPU its build cannot use, is a SKIP saying so.
"""

from __future__ import annotations

import dataclasses
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..backend.registry import LoadedBackend, backends, load_backend
from ..display import format_table
from ..errors import CannotRunHere
from ..spec.config import CONFIGS, BERTConfig
from ..spec.schema import SUPPORTED_DTYPES, random_weights
from ..spec.semantics import PRESETS
from ..training import PretrainingData, builtin_corpus, paragraphs_from_lines
from ..verify.cases import CASES
from ..verify.compare import compare_arrays, tolerance_for
from ..verify.conform import run_conformance
from ..verify.results import Target, compare_outputs
from . import bench
from .fixtures import fixture_failures, read_fixtures

FIXTURES = Path(__file__).resolve().parents[2] / "conformance" / "fixtures"  # in a source tree
TRAINING_STEPS = 3
Progress = Callable[[str], None]


@dataclass
class Part:
    """One check on one backend and GPU: PASS, FAIL or SKIP, a line for people, and its data."""

    check: str
    backend: str
    device: str
    status: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class GpuReport:
    parts: list[Part]
    environment: dict[str, Any]
    seconds: float = 0.0

    @property
    def checked(self) -> list[Part]:
        return [part for part in self.parts if part.status != "SKIP"]

    @property
    def failed(self) -> list[Part]:
        return [part for part in self.parts if part.status == "FAIL"]

    def verdict(self) -> str:
        """The one sentence the command ends with."""
        if not self.checked:
            seen = self.environment.get("nvidia-smi") or []
            return "nothing checked on a GPU: " + ("none found" if not seen else "no installed backend can use one")
        if self.failed:
            first = self.failed[0]
            return f"FAIL: {len(self.failed)} of {len(self.checked)} GPU checks failed, first {first.check} on " + (
                f"{first.backend} {first.device}: {first.detail}"
            )
        gpus = sorted({f"{part.backend} {part.device}" for part in self.checked})
        return f"PASS: all {len(self.checked)} checks on {', '.join(gpus)} conform."

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict(),
            "passed": not self.failed,
            "seconds": round(self.seconds, 1),
            "environment": self.environment,
            "parts": [dataclasses.asdict(part) for part in self.parts],
        }

    def table(self) -> str:
        """One row per check: what, where, the result and a line of detail."""
        rows = [(p.check, p.backend, p.device, p.status, p.detail) for p in self.parts]
        return format_table(("check", "backend", "device", "result", "detail"), rows)

    def markdown(self) -> str:
        """The summary written beside the JSON report."""
        lines = [
            "# gpu-check",
            "",
            self.verdict(),
            "",
            "```",
            self.table(),
            "```",
            "",
            "## Environment",
            "",
            *(f"- {key}: {value}" for key, value in self.environment.items()),
        ]
        bench_rows = [part for part in self.parts if part.check == "bench" and part.data.get("table")]
        for part in bench_rows:
            lines += ["", f"## bench, {part.backend} on {part.device}", "", "```", part.data["table"], "```"]
        return "\n".join(lines) + "\n"


def nvidia_smi() -> list[dict[str, str]]:
    """What ``nvidia-smi`` reports of each GPU (name, memory, driver), or [] where it is not here."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = []
    for line in done.stdout.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 3:
            found.append({"name": parts[0], "memory": parts[1], "driver": parts[2]})
    return found


def _framework(backend: LoadedBackend) -> str:
    """The framework and build, as a model of the backend reports it ("torch 2.13.0+cpu")."""
    config = bench.computable(backend, CONFIGS["tiny"])
    if config is None:
        return backend.name
    model = backend.build(config, random_weights(config), gradients=False)
    return str(model.runtime_info().get("framework", backend.name))


def gpus(seen: list[dict[str, str]]) -> tuple[list[tuple[LoadedBackend, str]], list[Part]]:
    """(backend, GPU device) for every installed backend and GPU it can use; a SKIP for each backend that
    cannot use one, naming its build where a GPU is here that it cannot use."""
    found, skipped = [], []
    for name, status in backends().items():
        if status.role == "oracle":
            continue
        if not status.available:
            skipped.append(Part("all", name, "-", "SKIP", str(status.reason)))
            continue
        backend = load_backend(name)
        devices = [device for device in backend.devices() if device != "cpu"]
        if devices:
            found += [(backend, device) for device in devices]
            continue
        build = _framework(backend)
        why = (
            f"{build} cannot use the GPU here ({seen[0]['name']}): its build has no CUDA"
            if seen
            else (f"{build} sees no GPU here")
        )
        skipped.append(Part("all", name, "-", "SKIP", why))
    return found, skipped


def _cases(config: BERTConfig) -> list:
    return [case.input(config) for case in CASES]


def check_conformance(backend: LoadedBackend, device: str, config: BERTConfig, progress: Progress) -> Iterator[Part]:
    """Every preset against the oracle on the GPU and the CPU, both dtypes, with GPU-vs-CPU pairs."""
    for preset in PRESETS:
        preset_config = config.with_semantics(preset)
        reason = backend.supports(preset_config, device)
        if reason is not None:
            yield Part(f"conformance {preset}", backend.name, device, "SKIP", reason)
            continue
        weights = random_weights(preset_config, seed=0, dtype="float64")
        targets = [Target(backend.name, dtype, where) for where in ("cpu", device) for dtype in SUPPORTED_DTYPES]
        progress(f"conformance {preset}: {backend.name} on {device}")
        report = run_conformance(preset_config, weights, targets, _cases(preset_config))
        worst = max((c.ratio for *_, c in report.worst()), default=float("inf"))
        detail = f"{len(report.checks)} checks, worst uses {worst:.2g}x its tolerance" + (
            f"; {len(report.failures())} failing, {len(report.errors)} errors" if not report.passed else ""
        )
        yield Part(f"conformance {preset}", backend.name, device, "PASS" if report.passed else "FAIL", detail,
                   report.to_json())  # fmt: skip


def check_fixtures(backend: LoadedBackend, device: str) -> Part:
    """The golden fixtures (every generation's tiny model), on the GPU, in both dtypes."""
    if not FIXTURES.is_dir():
        return Part("fixtures", backend.name, device, "SKIP", f"no fixtures at {FIXTURES} (not a source tree)")
    fixtures = read_fixtures(FIXTURES)
    failures = [line for dtype in SUPPORTED_DTYPES for line in fixture_failures(backend, fixtures, device, dtype)]
    detail = f"{len(fixtures)} fixtures x {len(fixtures[0].cases)} cases x 2 dtypes" + (
        f"; {len(failures)} out of tolerance, first: {failures[0]}" if failures else ", all within the policy"
    )
    return Part("fixtures", backend.name, device, "FAIL" if failures else "PASS", detail, {"failures": failures})


def check_tf32(backend: LoadedBackend, device: str, config: BERTConfig) -> Part:
    """The float32 run with TF32 off (held to the policy) and on (reported beside it), and that the
    report records which."""
    weights = random_weights(config, seed=0, dtype="float64")
    oracle = load_backend("numpy").build(config, weights)
    cases = [case for case in _cases(config) if case.max_len is None]
    tolerance = tolerance_for("float32", "gpu")
    found: dict[str, Any] = {}
    for tf32 in (False, True):
        try:
            model = backend.build(config, weights, device=device, dtype="float32", gradients=False, tf32=tf32)
        except CannotRunHere as error:
            return Part("tf32", backend.name, device, "SKIP", str(error))
        worst = 0.0
        passed = True
        for case in cases:
            outputs, intermediates = compare_outputs(
                model(**case.batch, intermediates=True), oracle(**case.batch, intermediates=True), tolerance
            )
            worst = max([worst, *(c.max_abs for c in outputs + intermediates)])
            passed = passed and all(c.passed for c in outputs + intermediates)
        found["on" if tf32 else "off"] = {"max_abs": worst, "within_policy": passed, "runtime": model.runtime_info()}
    recorded = [found[key]["runtime"].get("tf32") for key in ("off", "on")] == [False, True]
    status = "PASS" if found["off"]["within_policy"] and recorded else "FAIL"
    detail = (
        f"TF32 off: max abs error {found['off']['max_abs']:.2e} ("
        + ("within" if found["off"]["within_policy"] else "OUTSIDE")
        + f" the float32 policy); TF32 on: {found['on']['max_abs']:.2e}"
        + ("" if recorded else "; the report does not record the TF32 setting")
    )
    return Part("tf32", backend.name, device, status, detail, found)


def check_training(backend: LoadedBackend, device: str, progress: Progress) -> Iterator[Part]:
    """Gradients and a few pretraining steps on the GPU against the CPU, from the same weights and
    batches: float64 to the pair bound, float32 to the float32 pair policy."""
    if not backend.can_train:
        yield Part("training", backend.name, device, "SKIP", f"backend {backend.name!r} cannot train")
        return
    data = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(200)), max_len=64)
    base = CONFIGS["chapter"]
    config = dataclasses.replace(base, vocab_size=len(data.vocab), max_len=data.max_len, dropout=0.0)
    stream = data.batches(8, seed=0)
    batches = [next(stream) for _ in range(TRAINING_STEPS)]
    for dtype in SUPPORTED_DTYPES:
        progress(f"training {dtype}: {backend.name} on {device}")
        tolerance = tolerance_for(dtype, "gpu", pair=True)
        weights = random_weights(config, seed=0, dtype=dtype)
        # SGD: Adam divides by the root of each gradient's running square, so it turns rounding-level
        # differences in near-zero gradients into whole steps of lr (docs/gpu.md).
        trainers = {where: backend.trainer(backend.build(config, weights, device=where, dtype=dtype), optimizer="sgd")
                    for where in ("cpu", device)}  # fmt: skip
        comparisons = []
        (_, cpu_grads), (_, gpu_grads) = (trainers[where].gradients(batches[0]) for where in ("cpu", device))
        comparisons += [compare_arrays(f"gradient {n}", gpu_grads[n], cpu_grads[n], tolerance) for n in cpu_grads]
        losses = {where: [trainer.step(batch).total for batch in batches] for where, trainer in trainers.items()}
        comparisons.append(compare_arrays("losses", np.array(losses[device]), np.array(losses["cpu"]), tolerance))
        after = {where: trainer.model.export_weights() for where, trainer in trainers.items()}
        comparisons += [compare_arrays(n, after[device][n], after["cpu"][n], tolerance) for n in after["cpu"]]
        failing = [c for c in comparisons if not c.passed]
        worst = max(comparisons, key=lambda c: c.ratio)
        detail = (
            f"gradients, {TRAINING_STEPS} steps' losses and weights, {len(comparisons)} comparisons against the "
            f"CPU; worst {worst.name} uses {worst.ratio:.2g}x its tolerance"
            + (f"; first failing: {failing[0].describe()}" if failing else "")
        )
        yield Part(f"training {dtype}", backend.name, device, "FAIL" if failing else "PASS", detail,
                   {"losses": losses, "worst": worst.describe()})  # fmt: skip


def check_bench(backend: LoadedBackend, device: str, shapes: list[str], rounds: int, progress: Progress) -> Part:
    """``bench`` on the GPU: forward at each shape and dtype, and a training step."""
    # Eager only: what the GPU checks hold to the CPU's results is the eager model.
    rows = bench.run_bench(
        shapes, list(SUPPORTED_DTYPES), rounds, True, progress, False, device, [backend.name], compiled=False
    )
    if not rows:
        return Part("bench", backend.name, device, "SKIP", "nothing to time")
    fastest = max((row for row in rows if row.tokens), key=lambda row: row.tokens / row.median)
    rate = fastest.tokens / fastest.median
    detail = f"{len(rows)} workloads; fastest {fastest.workload} {fastest.dtype}: {rate:,.0f} tokens/s"
    table = bench.format_rows(rows)
    return Part("bench", backend.name, device, "PASS", detail, {"rows": [r.to_json() for r in rows], "table": table})


def environment(seen: list[dict[str, str]], found: list[tuple[LoadedBackend, str]]) -> dict[str, Any]:
    """What the checks ran on: versions, and each backend's GPU as a model on it reports it (name,
    memory, CUDA version, framework and build), with what nvidia-smi says (the driver)."""
    devices = {}
    for backend, device in found:
        config = bench.computable(backend, CONFIGS["tiny"], device) or CONFIGS["tiny"].with_semantics("bert")
        model = backend.build(config, random_weights(config), device=device, gradients=False)
        devices[f"{backend.name} {device}"] = model.runtime_info()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "numpy": np.__version__,
        "nvidia-smi": seen,
        "devices": devices,
    }


def _checks_on(
    backend: LoadedBackend, device: str, config: BERTConfig, shapes: list[str], rounds: int, say: Progress
) -> list[Part]:
    """Every check of one backend on one GPU, each guarded."""
    checks: list[tuple[str, Callable[[], Iterable[Part]]]] = [
        ("conformance", lambda: check_conformance(backend, device, config, say)),
        ("fixtures", lambda: [check_fixtures(backend, device)]),
        ("tf32", lambda: [check_tf32(backend, device, config)]),
        ("training", lambda: check_training(backend, device, say)),
        ("bench", lambda: [check_bench(backend, device, shapes, rounds, say)]),
    ]
    return [part for name, check in checks for part in _guarded(name, backend, device, check)]


def _guarded(name: str, backend: LoadedBackend, device: str, check: Callable[[], Iterable[Part]]) -> list[Part]:
    """The parts ``check`` makes; what it cannot do here is a SKIP, and anything else it raises a FAIL
    saying what, so that one broken check still leaves the others and the report."""
    done: list[Part] = []
    try:
        for part in check():
            done.append(part)
    except CannotRunHere as error:
        done.append(Part(name, backend.name, device, "SKIP", str(error)))
    except Exception as error:  # noqa: BLE001 - a backend's failure on the GPU is reported, not raised
        done.append(Part(name, backend.name, device, "FAIL", f"raised {type(error).__name__}: {error}"))
    return done


def run_gpu_check(quick: bool = False, bench_rounds: int = 3, progress: Progress | None = None) -> GpuReport:
    """Every check on every GPU and backend that can use one; ``quick``: the tiny model and shape."""
    started = time.perf_counter()
    say = progress or (lambda label: None)
    seen = nvidia_smi()
    found, parts = gpus(seen)
    config = CONFIGS["tiny" if quick else "chapter"]
    shapes, rounds = (["tiny"], 1) if quick else (["chapter", "base"], bench_rounds)
    for backend, device in found:
        parts += _checks_on(backend, device, config, shapes, rounds, say)
    report = GpuReport(parts, environment(seen, found))
    report.seconds = time.perf_counter() - started
    return report
