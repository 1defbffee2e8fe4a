"""``make gpu``: everything to run in a short stretch of GPU time, as one prepared command.

``pytest -m cuda`` (the test suite's GPU tests), then ``bert-multi gpu-check`` (every GPU check, its bench
part the GPU speeds side by side) with what is left of the time as its budget, from the source tree with
the machine's own ``python3``. Everything goes into one directory, at most ``MAX_FILES`` files: what each
printed, gpu-check's reports, and ``summary.md``, the page that docs/gpu.md's "last real GPU run" holds.
Run it as ``PYTHONPATH=. python3 -m bert_multi.tools.gpu_run --out DIR`` where ``make`` is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parents[2]
TOTAL_S = 360  # 6 minutes: with the machine's start and the copies, 15 minutes hold a run and a rerun
PYTEST_S = 90
MAX_FILES = 8
# JAX's compiled code kept between runs on the same machine, so that a rerun does not compile again (a
# first run's compiling is most of JAX's time); bounded by the machine's lease, not by us.
CACHE = {
    "JAX_COMPILATION_CACHE_DIR": str(Path.home() / ".cache" / "bert_multi" / "jax"),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}


def _stream(
    command: list[str], seconds: float, log: TextIO, copy: TextIO, env: dict[str, str], stamped: bool = False
) -> tuple[int, float]:
    """Run ``command`` in the source tree, each line it prints shown at once and written to ``log`` and
    ``copy`` (``stamped``: after the seconds since it started, for a command that does not say when);
    stopped (its whole process group) after ``seconds``. Its exit status (124 when stopped) and how long
    it took."""
    started = time.perf_counter()
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as process:
        assert process.stdout is not None
        watchdog = threading.Timer(seconds, os.killpg, (process.pid, signal.SIGKILL))
        watchdog.start()
        try:
            for line in process.stdout:
                if stamped:
                    line = f"[{time.perf_counter() - started:6.1f} s] {line}"
                for stream in (sys.stdout, log, copy):
                    stream.write(line)
                    stream.flush()
            code = process.wait()
        finally:
            watchdog.cancel()
    return (124 if code == -signal.SIGKILL else code), time.perf_counter() - started


def summary(pytest: tuple[int, float, str], check: dict[str, Any] | None, total: float) -> str:
    """The page a run leaves for docs/gpu.md: the machine, every part's verdict and time, TF32's effect
    in each framework, and the speeds."""
    code, seconds, last = pytest
    lines = ["# A GPU run", ""]
    if check is None:
        lines += ["gpu-check wrote no report.", ""]
    else:
        environment = check["environment"]
        for gpu in environment.get("nvidia-smi") or []:
            lines.append(f"- GPU: {gpu['name']}, {gpu['memory']}, driver {gpu['driver']}")
        lines.append(f"- Python {environment['python']}, NumPy {environment['numpy']}, {environment['platform']}")
        for where, info in environment.get("devices", {}).items():
            lines.append(f"- {where}: {info.get('framework')}, {info.get('threads')} CPU threads")
        lines.append("")
    status = "stopped at its time limit" if code == 124 else f"exit status {code}"
    lines += [f"`pytest -m cuda`: {last} ({status}, {seconds:.0f} s)", ""]
    if check is not None:
        lines += [f"`gpu-check` ({check['seconds']:.0f} s): {check['verdict']}", ""]
        rows = ["| check | backend | device | result | s | CPU s | detail |", "|---|---|---|---|---|---|---|"]
        for part in check["parts"]:
            took = "-" if part["seconds"] is None else f"{part['seconds']:.1f}"
            cpu = "-" if part["cpu_seconds"] is None else f"{part['cpu_seconds']:.1f}"
            detail = part["detail"].replace("|", "/")
            rows.append(f"| {part['check']} | {part['backend']} | {part['device']} | {part['status']} | {took} | {cpu} "
                        f"| {detail} |")  # fmt: skip
        lines += rows + [""]
        tf32 = [part for part in check["parts"] if part["check"] == "tf32" and part["status"] in ("PASS", "FAIL")]
        if tf32:
            lines += ["TF32's effect (max abs error against the float64 oracle, float32):", ""]
            for part in tf32:
                off, on = part["data"]["off"]["max_abs"], part["data"]["on"]["max_abs"]
                lines.append(
                    f"- {part['backend']}: TF32 off {off:.2e}, TF32 on {on:.2e} ({on / max(off, 1e-300):.0f}x)"
                )
            lines.append("")
        for part in check["parts"]:
            if part["check"] == "bench" and part["data"].get("table"):
                lines += [f"Speeds on {part['device']}:", "", "```", part["data"]["table"], "```", ""]
    lines.append(f"The whole run: {total:.0f} s.")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bert_multi.tools.gpu_run", description=__doc__)
    parser.add_argument("--out", default="gpu-run", metavar="DIR", help="where everything goes (default gpu-run/)")
    parser.add_argument("--total", type=float, default=TOTAL_S, help=f"seconds for the whole run (default {TOTAL_S})")
    parser.add_argument("--tests", nargs="*", default=[], help="what pytest -m cuda collects (default: the suite)")
    parser.add_argument("--quick", action="store_true", help="gpu-check --quick")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env = {**CACHE, **env}  # the user's own settings first
    with open(out / "gpu-run.log", "w") as log:
        with open(out / "pytest-cuda.txt", "w") as copy:
            # A test a line, each stamped, and the slowest at the end: a run stopped at its limit still
            # shows where its time went.
            command = [sys.executable, "-m", "pytest", "-m", "cuda", "-v", "--durations=15", "-p", "no:cacheprovider"]
            code, took = _stream(command + args.tests, min(PYTEST_S, args.total / 3), log, copy, env, stamped=True)
        printed = (out / "pytest-cuda.txt").read_text().strip().splitlines()
        last = printed[-1].split("] ", 1)[-1].strip("= ") if printed else "printed nothing"  # less its stamp
        pytest = (code, took, last)
        budget = max(args.total - (time.perf_counter() - started) - 20, 10)  # 20 s for the reports and the exit
        command = [sys.executable, "-m", "bert_multi.cli", "gpu-check", "--out", str(out), "--budget", f"{budget:.0f}"]
        with open(out / "gpu-check.txt", "w") as copy:
            checked, _ = _stream(command + (["--quick"] if args.quick else []), budget + 60, log, copy, env)
    report = out / "gpu-check.json"
    check = json.loads(report.read_text()) if report.is_file() else None
    (out / "summary.md").write_text(summary(pytest, check, time.perf_counter() - started))
    print(f"\n{len(list(out.iterdir()))} files in {out}; summary.md says:")
    print(f"pytest -m cuda: {pytest[2]}\ngpu-check: {check['verdict'] if check else 'no report'}")
    return 0 if code == 0 and checked == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
