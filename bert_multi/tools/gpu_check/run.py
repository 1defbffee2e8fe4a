"""A gpu-check run: the GPUs and the backends that can use them, the plan (every check on each, check by
check), and running it within a budget, telling a listener as it goes."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...backend.contract import parse_device
from ...backend.registry import LoadedBackend, backends, load_backend
from ...errors import CannotRunHere
from ...spec.config import CONFIGS
from ...spec.schema import random_weights
from .. import bench
from .checks import CHECKS, BudgetSpent, Check, Setting
from .report import FAIL, NOT_RUN, SKIP, GpuReport, Part


class Deadline:
    """The run's budget in seconds of wall time (None: no limit), counted from its start."""

    def __init__(self, budget: float | None) -> None:
        self.budget, self.started = budget, time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def spent(self) -> bool:
        return self.budget is not None and self.elapsed() >= self.budget

    def check(self) -> None:
        if self.spent():
            raise BudgetSpent


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
            skipped.append(Part("all", name, "-", SKIP, str(status.reason)))
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
        skipped.append(Part("all", name, "-", SKIP, why))
    return found, skipped


@dataclass
class Listener:
    """What a run tells as it goes: a line as each part starts and ends, the steps within a part (a
    progress bar), and the report so far after each part (to write it), starting with the plan."""

    line: Callable[[str], None] = lambda text: None
    step: Callable[[int, int, str], None] = lambda done, planned, label: None
    report: Callable[[GpuReport], None] = lambda report: None


def environment(seen: list[dict[str, str]], found: list[tuple[LoadedBackend, str]]) -> dict[str, Any]:
    """What the checks ran on: versions, and each backend's GPU as a model on it reports it (name,
    memory, CUDA version, framework and build, threads, matmul precision), with what nvidia-smi says."""
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


@dataclass(frozen=True)
class Unit:
    """One check on the backends it runs on and their GPU: the parts it makes."""

    check: Check
    backends: list[LoadedBackend]
    device: str

    @property
    def label(self) -> str:
        return "+".join(backend.name for backend in self.backends)

    def not_run(self, why: str) -> Part:
        return Part(self.check.name, self.label, self.device, NOT_RUN, why)


def plan(found: list[tuple[LoadedBackend, str]], quick: bool) -> list[Unit]:
    """Every check (of a quick run, those marked ``quick``) on every backend and GPU, check by check."""
    units = []
    for check in CHECKS:
        if quick and not check.quick:
            continue
        if check.together:
            by_gpu: dict[object, list[tuple[LoadedBackend, str]]] = {}
            for backend, device in found:
                by_gpu.setdefault(parse_device(device), []).append((backend, device))
            units += [Unit(check, [b for b, _ in group], group[0][1]) for group in by_gpu.values()]
        else:
            units += [Unit(check, [backend], device) for backend, device in found]
    return units


def run_unit(unit: Unit, setting: Setting) -> Iterator[Part]:
    """The parts ``unit`` makes, each timed; what it cannot do here is a SKIP, and anything else it raises
    a FAIL saying what, so that one broken check still leaves the others and the report."""
    started, cpu = time.perf_counter(), time.process_time()

    def timed(part: Part) -> Part:
        nonlocal started, cpu
        part.seconds, part.cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
        started, cpu = time.perf_counter(), time.process_time()
        return part

    name, label, device = unit.check.name, unit.label, unit.device
    try:
        for part in unit.check.run(setting, unit.backends, device):
            yield timed(part)
    except CannotRunHere as error:
        yield timed(Part(name, label, device, SKIP, str(error)))
    except Exception as error:  # noqa: BLE001 - a backend's failure on the GPU is reported, not raised
        yield timed(Part(name, label, device, FAIL, f"raised {type(error).__name__}: {error}"))
    except BudgetSpent:
        yield timed(unit.not_run(f"stopped at the budget after {time.perf_counter() - started:.0f} s in it"))


def run_gpu_check(
    quick: bool = False, bench_rounds: int = 3, budget: float | None = None, listener: Listener | None = None
) -> GpuReport:
    """Every check on every GPU and backend that can use one, in the order of ``CHECKS``; ``quick``: the
    tiny model and the checks marked quick; ``budget``: stop when that many seconds are spent, what did
    not run listed as NOT RUN. ``listener`` hears of each part as it starts and ends, and gets the report
    after each."""
    listen = listener or Listener()
    deadline = Deadline(budget)
    seen = nvidia_smi()
    found, skipped = gpus(seen)
    units = plan(found, quick)
    report = GpuReport(
        [*skipped, *(unit.not_run("not reached yet") for unit in units)], environment(seen, found), 0.0, budget, quick
    )
    listen.report(report)

    def step(done: int, planned: int, label: str) -> None:
        deadline.check()
        listen.step(done, planned, label)

    setting = Setting(quick, CONFIGS["tiny" if quick else "chapter"], bench_rounds, step, listen.line)
    slot = len(skipped)  # where the next unit's NOT RUN stands in the report, to be replaced by its parts
    for index, unit in enumerate(units):
        if deadline.spent():
            report.parts[slot] = unit.not_run(f"the budget of {budget:g} s was spent before it started")
            slot += 1
            continue
        listen.line(f"[{deadline.elapsed():6.1f} s] {index + 1}/{len(units)} {unit.check.name} on {unit.label} "
                    f"{unit.device}: started")  # fmt: skip
        made = 0
        for part in run_unit(unit, setting):  # each part told and written as it ends
            if made:
                report.parts.insert(slot + made, part)
            else:
                report.parts[slot] = part
            made += 1
            cost = f"{part.seconds or 0:.1f} s, CPU {part.cpu_seconds or 0:.1f} s"
            listen.line(f"[{deadline.elapsed():6.1f} s] {part.check} on {part.backend} {part.device}: "
                        f"{part.status} ({cost}): {_short(part.detail)}")  # fmt: skip
            report.seconds = deadline.elapsed()
            listen.report(report)
        if not made:  # a check that ran nothing has not passed
            report.parts[slot] = Part(unit.check.name, unit.label, unit.device, FAIL, "the check made no result")
            listen.report(report)
        slot += max(made, 1)
    report.seconds = deadline.elapsed()
    listen.report(report)
    return report


def _short(text: str, width: int = 110) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
