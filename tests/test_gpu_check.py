"""``bert-multi gpu-check``: run as a GPU machine runs it (from the source tree, ``python -m``, NumPy 2 and
no MXNet), and every check exercised on a stand-in GPU, passing and failing; the run's order, its
progress, its reports rewritten after every part, and its budget."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bert_multi import CONFIGS, load_backend, register_backend, unregister_backend
from bert_multi.backend.contract import matmul_precision, parse_device
from bert_multi.backend.registry import not_in_process
from bert_multi.tools import bench
from bert_multi.tools.gpu_check import (
    CHECKS,
    EXIT_INCOMPLETE,
    NOT_RUN,
    Check,
    Listener,
    Setting,
    Unit,
    check_fixtures,
    conformance,
    nvidia_smi,
    plan,
    run_gpu_check,
    run_unit,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not not_in_process("mxnet"), reason="runs in the NumPy-2 environment (no MXNet), as a GPU machine")
def test_gpu_check_runs_from_the_source_tree_as_on_a_gpu_machine(tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "bert_multi.cli", "gpu-check", "--quick", "--out", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=environment, timeout=600)
    document = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    summary = (tmp_path / "out" / "gpu-check.md").read_text()
    assert done.stdout.strip().splitlines()[-1] == document["verdict"] and document["verdict"] in summary
    statuses = {part["status"] for part in document["parts"]}
    if not nvidia_smi() and not any("cuda" in d or "gpu" in d for d in document["environment"]["devices"]):
        assert done.returncode == 0 and document["verdict"] == "nothing checked on a GPU: none found"
        assert statuses == {"SKIP"} and any(p["backend"] == "mxnet" for p in document["parts"])
        assert "sees no GPU here" in summary
    else:  # on a GPU machine: the exit status is the verdict's
        assert done.returncode == (1 if "FAIL" in statuses else EXIT_INCOMPLETE if NOT_RUN in statuses else 0)


class StandInGPU:
    """A backend of this machine claiming a GPU, an H200 (its models run on the CPU): every check of
    gpu-check runs on it here, where no GPU is. On the torch backend it trains too. ``fault``: a GPU kernel
    that scales the FFN, or a model whose runtime info misstates the TF32 it was built with (in one of four
    ways), or one that takes ``slow`` seconds a forward."""

    NAME = "standin"
    ROLE = "framework"
    forwards = 0  # slow forwards begun, by every stand-in: what a budget bounds, counted

    def __init__(self, base="numpy", fault=None, slow=0.0):
        self.base, self.fault, self.slow = load_backend(base), fault, slow
        if self.base.can_train:
            self.Pretrainer = self.base.Pretrainer

    def devices(self):
        return ["cpu", "gpu:0"]

    def _begun(self):
        StandInGPU.forwards += 1

    def build(self, config, weights, device="cpu", dtype="float32", gradients=True, share=False, tf32=False):
        if self.fault == "scaled FFN" and parse_device(device).kind == "gpu":
            weights = {k: v * (1.01 if ".ffn.dense2." in k else 1) for k, v in weights.items()}
        options = {"gradients": gradients} if self.base.name != "numpy" else {}
        model = self.base.build(config, weights, dtype=dtype, **options)
        recorded = model.framework_info()  # as the CPU model it is
        model.device, model.backend = parse_device(device), self.NAME
        stated = matmul_precision(dtype, model.device, tf32 if self.fault != "silent about TF32" else False)
        if self.fault == "no TF32 key":
            del stated["tf32"]
        elif self.fault == "TF32 off in its info":
            stated["tf32"] = False
        elif self.fault == "products in full in its info":
            stated["matmul precision"] = dtype
        gpu = {"gpu": "Stand-in H200"} if model.device.kind == "gpu" else {}
        model.framework_info = lambda: {**recorded, **stated, **gpu}
        model.at_precision = lambda **options: None  # its statements are its build's: built again for another
        if self.slow:
            forward = model._forward
            model._forward = lambda *args: self._begun() or time.sleep(self.slow) or forward(*args)
        return model


@pytest.fixture
def stand_in(request):
    base, fault, *slow = getattr(request, "param", ("numpy", None))
    if not_in_process(base):
        pytest.skip(not_in_process(base))
    backend = register_backend(StandInGPU(base, fault, *slow))
    yield backend
    unregister_backend("standin")


class Heard(Listener):
    """A listener keeping every line and every report it is given, the report as it was then."""

    def __init__(self):
        self.lines, self.reports = [], []
        super().__init__(self.lines.append, lambda done, planned, label: None, self.keep)

    def keep(self, report):
        self.reports.append([(part.check, part.backend, part.status, part.detail) for part in report.parts])


def ours(parts):
    return [part for part in parts if part.backend == "standin"]


def test_the_checks_run_in_the_order_of_what_they_prove_and_quick_runs_the_first_ones():
    found = [(load_backend("numpy"), "gpu:0")]
    full = [unit.check.name for unit in plan(found, quick=False)]
    assert full == [
        "conformance d2l",
        "tf32",
        "training",
        "conformance d2l-0.12",
        "conformance d2l-0.11",
        "conformance bert",
        "fixtures",
        "bench",
    ]
    assert [unit.check.name for unit in plan(found, quick=True)] == ["conformance d2l", "tf32", "training", "bench"]
    assert all(check.proves for check in CHECKS)
    # Check by check: every backend's first check before any backend's second; bench once per GPU.
    two = plan([(load_backend("numpy"), "gpu:0"), (load_backend("numpy"), "cuda:0")], quick=True)
    assert [unit.check.name for unit in two] == ["conformance d2l"] * 2 + ["tf32"] * 2 + ["training"] * 2 + ["bench"]


@pytest.mark.parametrize("stand_in", [("torch", None)], indirect=True)
def test_every_quick_check_runs_on_a_gpu_and_a_conforming_backend_passes_telling_as_it_goes(stand_in):
    heard = Heard()
    report = run_gpu_check(quick=True, bench_rounds=1, listener=heard)
    parts = {part.check: part for part in report.parts if "standin" in part.backend}
    assert list(parts) == ["conformance d2l", "tf32", "training float32", "training float64", "bench"]
    assert all(part.status == "PASS" for part in parts.values()), report.table()
    assert report.exit_status() == 0 and report.verdict().startswith("PASS: all ")
    assert "gradients, 3 steps' losses and weights" in parts["training float64"].detail
    # GPU-vs-CPU pairs in both dtypes, and each model's TF32 setting and product precision stated both ways
    pairs = {row["reference"] for row in parts["conformance d2l"].data["worst"] if "via" in row["reference"]}
    assert pairs and all("standin" in pair for pair in pairs)
    stated = [(parts["tf32"].data[key]["runtime"]["tf32"], parts["tf32"].data[key]["runtime"]["matmul precision"])
              for key in ("off", "on")]  # fmt: skip
    assert stated == [(False, "float32"), (True, "tf32")]
    assert all(part.seconds > 0 and part.cpu_seconds >= 0 for part in parts.values())
    # A line as each unit starts and as each part ends, in order; the report after each unit, beginning
    # with the plan: everything not reached yet, then one unit more each time.
    told = [line for line in heard.lines if line.startswith("bench: ")]  # each bench row as it is timed
    assert len(told) == len(parts["bench"].data["rows"]) and all(" ms (" in line for line in told)
    started = [line for line in heard.lines if line.endswith(": started")]
    ended = [line for line in heard.lines if not line.endswith(": started") and line not in told]
    assert len(started) == 4 and len(ended) == 5 and heard.lines.index(started[1]) > heard.lines.index(ended[0])
    assert all(": PASS (" in line and " s, CPU " in line for line in ended)
    first, *later = heard.reports
    assert [status for _, backend, status, _ in first if backend == "standin"] == [NOT_RUN] * 4
    assert {detail for _, backend, _, detail in first if backend == "standin"} == {"not reached yet"}
    not_run = [sum(status == NOT_RUN for _, _, status, _ in snapshot) for snapshot in later]
    assert not_run == [3, 2, 1, 1, 0, 0]  # after each part (training makes two), and once more at the end


@pytest.mark.parametrize("stand_in", [("numpy", None)], indirect=True)
def test_the_full_runs_checks_pass_on_a_conforming_backend(stand_in):
    """The checks only a full run makes, each on the stand-in (the tiny model: what they check is the
    same), and the chapter's model being what a full run uses."""
    setting = Setting(False, CONFIGS["tiny"], 1, lambda done, planned, label: None)
    checks = (check_fixtures, conformance("d2l-0.11", pairs=False), conformance("bert", pairs=False))
    (fixtures,), (tiled,), (original,) = (list(check(setting, [stand_in], "gpu:0")) for check in checks)
    assert [part.status for part in (fixtures, tiled, original)] == ["PASS"] * 3, fixtures.detail
    assert fixtures.detail == "5 fixtures x 10 cases x 2 dtypes, all within the policy"
    for part in (tiled, original):  # the GPU against the oracle, without pairs
        assert {row["target"] for row in part.data["worst"]} == {"standin float32 gpu:0", "standin float64 gpu:0"}
        assert part.data["checks"] == 20


@pytest.mark.parametrize("stand_in", [("numpy", "scaled FFN")], indirect=True)
def test_a_gpu_that_computes_something_else_fails_and_says_where(stand_in):
    report = run_gpu_check(quick=True, bench_rounds=1)
    failed = {part.check for part in report.failed}
    assert {"conformance d2l", "tf32"} <= failed
    assert "first divergence at 'blks.0.ffn'" in "\n".join(ours(report.parts)[0].data["failures"])
    skipped = [part for part in ours(report.parts) if part.status == "SKIP"]
    assert [part.check for part in skipped] == ["training"] and "cannot train" in skipped[0].detail
    assert report.verdict().startswith("FAIL: ") and "standin gpu:0" in report.verdict()
    assert report.exit_status() == 1
    setting = Setting(True, CONFIGS["tiny"], 1, lambda done, planned, label: None)
    (fixtures,) = check_fixtures(setting, [stand_in], "gpu:0")
    assert fixtures.status == "FAIL" and "out of tolerance" in fixtures.detail


@pytest.mark.parametrize(
    "stand_in",
    [
        ("numpy", "silent about TF32"),
        ("numpy", "no TF32 key"),
        ("numpy", "TF32 off in its info"),
        ("numpy", "products in full in its info"),
    ],
    indirect=True,
)
def test_the_tf32_check_fails_a_model_that_does_not_state_the_setting_it_was_built_with(stand_in):
    setting = Setting(True, CONFIGS["tiny"], 1, lambda done, planned, label: None)
    (part,) = next(check for check in CHECKS if check.name == "tf32").run(setting, [stand_in], "gpu:0")
    assert part.status == "FAIL" and "do not state the setting they were built with" in part.detail


@pytest.mark.parametrize("stand_in", [("torch", "scaled FFN")], indirect=True)
def test_the_training_check_trains_on_the_gpu_it_names(stand_in):
    """A backend whose training on the GPU differs from its training on the CPU fails the check."""
    setting = Setting(True, CONFIGS["tiny"], 1, lambda done, planned, label: None)
    parts = list(next(check for check in CHECKS if check.name == "training").run(setting, [stand_in], "gpu:0"))
    assert [part.check for part in parts] == ["training float32", "training float64"]
    assert all(part.status == "FAIL" and "first failing: gradient" in part.detail for part in parts), parts


@pytest.mark.parametrize("stand_in", [("numpy", None, 0.001)], indirect=True)
def test_a_budget_stops_the_run_cleanly_and_lists_what_did_not_run(stand_in, tmp_path, capsys, monkeypatch):
    """A budget spent inside a part stops it between two steps: that part and every later one are NOT
    RUN, never PASS; the verdict says INCOMPLETE and the exit status is its own. The budget is counted in
    work, not read from a clock (a busy machine would spend it on the set-up): each slow forward is 0.2 s
    of it, so a budget of 1 s is spent in the first part, after five."""
    from bert_multi.cli import main
    from bert_multi.tools.gpu_check import run

    class CountedDeadline(run.Deadline):
        def elapsed(self):
            return StandInGPU.forwards * 0.2

    monkeypatch.setattr(run, "Deadline", CountedDeadline)
    heard = Heard()
    StandInGPU.forwards = 0
    report = run_gpu_check(quick=True, budget=1, listener=heard)
    first, *rest = ours(report.parts)
    assert first.check == "conformance d2l" and first.status == NOT_RUN and "stopped at the budget" in first.detail
    assert [part.status for part in rest] == [NOT_RUN] * 3
    assert all("the budget of 1 s was spent before it started" in part.detail for part in rest)
    assert report.verdict().startswith("INCOMPLETE: 0 GPU checks passed; 4 not run")
    assert report.exit_status() == EXIT_INCOMPLETE and not report.to_json()["passed"]
    assert StandInGPU.forwards == 5  # stopped at the step that spent it, not a step later
    StandInGPU.forwards = 0
    assert main(["gpu-check", "--quick", "--budget", "1", "--out", str(tmp_path)]) == EXIT_INCOMPLETE
    document = json.loads((tmp_path / "gpu-check.json").read_text())
    assert document["budget"] == 1 and document["verdict"].startswith("INCOMPLETE")
    assert capsys.readouterr().out.strip().splitlines()[-1] == document["verdict"]
    assert main(["gpu-check", "--budget", "0", "--out", str(tmp_path)]) == 2


@pytest.mark.parametrize("stand_in", [("torch", None)], indirect=True)
def test_a_report_records_everything_as_json_and_markdown(stand_in, tmp_path, capsys):
    from bert_multi.cli import main

    assert main(["gpu-check", "--quick", "--bench-rounds", "1", "--out", str(tmp_path)]) == 0
    document = json.loads((tmp_path / "gpu-check.json").read_text())
    assert document["passed"] and np.isfinite(document["seconds"]) and document["quick"]
    summary = (tmp_path / "gpu-check.md").read_text()
    assert "## bench on gpu:0" in summary and "MFU" in summary
    printed = capsys.readouterr().out
    assert "1/4 conformance d2l on standin gpu:0: started" in printed and "bench on standin gpu:0: PASS" in printed


@pytest.mark.parametrize("stand_in", [("torch", None)], indirect=True)
def test_the_gpu_bench_times_each_precision_on_the_device_with_its_share_of_the_data_sheets_peak(stand_in):
    timed = bench.workloads("gpu:0", bench.QUICK_SHAPES, None, 1, True, ["standin"], compiled=False)
    rows = [row for _, workload in timed for row in workload()]
    # The stand-in takes tf32 but not mixed_precision: its bfloat16 rows are left out, not faked. Its model
    # is timed on its device and, apart, through the common interface's NumPy round trip (at the first
    # precision).
    assert {(row.workload, row.backend, row.dtype) for row in rows} == {
        *(("forward tiny 4x16 on gpu:0", "standin", precision) for precision in ("float32", "tf32")),
        ("forward tiny 4x16 on gpu:0", "standin (NumPy round trip)", "float32"),
        *(("train step tiny 8x16 on gpu:0", "standin", precision) for precision in ("float32", "tf32")),
    }  # fmt: skip
    for row in rows:
        peak = {"float32": 67e12, "tf32": 494.5e12}[row.dtype]  # an H200's, dense
        assert row.peak_source == f"Stand-in H200 data sheet, {row.dtype}"
        assert row.share == pytest.approx(row.flops / row.median / peak)
        # The MLM head's FLOPs count: 2 predicted positions of the 16 in each of 4 sequences, forward.
        forward = bench.forward_flops(CONFIGS["tiny"], 4, 16, 2)
        assert forward > bench.forward_flops(CONFIGS["tiny"], 4, 16) and (row.flops == forward) == (
            "forward" in row.workload
        )
    assert bench.gpu_peak("NVIDIA H100 PCIe", "bfloat16") == 756.5e12 and bench.gpu_peak("NVIDIA T4", "tf32") is None
    assert "(dense; MFU)" in bench.format_rows(rows)


def test_a_check_that_raises_is_a_fail_saying_what_and_the_others_still_run():
    from bert_multi.errors import CannotRunHere
    from bert_multi.tools.gpu_check import Part

    backend = load_backend("numpy")

    def breaks(setting, backends, device):
        yield Part("conformance d2l", "numpy", "gpu:0", "PASS", "fine")
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def cannot(setting, backends, device):
        raise CannotRunHere("no such device")
        yield

    setting = Setting(True, CONFIGS["tiny"], 1, lambda done, planned, label: None)
    parts = [
        *run_unit(Unit(Check("conformance", "-", breaks), [backend], "gpu:0"), setting),
        *run_unit(Unit(Check("tf32", "-", cannot), [backend], "gpu:0"), setting),
    ]
    assert [(p.check, p.status) for p in parts] == [
        ("conformance d2l", "PASS"),
        ("conformance", "FAIL"),
        ("tf32", "SKIP"),
    ]
    assert parts[1].detail == "raised RuntimeError: CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize("stand_in", [("numpy", None)], indirect=True)
def test_a_check_that_makes_no_result_is_a_fail_and_the_run_does_not_pass(stand_in, monkeypatch):
    from bert_multi.tools.gpu_check import run

    monkeypatch.setattr(run, "CHECKS", (Check("silent", "nothing", lambda setting, backends, device: iter(())),))
    report = run_gpu_check(quick=True, bench_rounds=1)
    (part,) = ours(report.parts)
    assert (part.check, part.status, part.detail) == ("silent", "FAIL", "the check made no result")
    assert report.exit_status() != 0 and report.verdict().startswith("FAIL")


@pytest.mark.skipif(not not_in_process("mxnet"), reason="runs in the NumPy-2 environment (no MXNet), as a GPU machine")
def test_the_prepared_gpu_run_leaves_a_few_files_and_a_summary(tmp_path, capsys):
    from bert_multi.tools import gpu_run

    code = gpu_run.main(["--out", str(tmp_path), "--total", "300", "--tests", "conformance/test_fixtures.py"])
    files = sorted(path.name for path in tmp_path.iterdir())
    assert files == ["gpu-check.json", "gpu-check.md", "gpu-check.txt", "gpu-run.log", "pytest-cuda.txt", "summary.md"]
    assert len(files) <= gpu_run.MAX_FILES
    summary = (tmp_path / "summary.md").read_text()
    verdict = json.loads((tmp_path / "gpu-check.json").read_text())["verdict"]
    assert "`gpu-check` (" in summary and verdict in summary and "`pytest -m cuda`: " in summary
    assert re.search(
        r"^\[ *[0-9.]+ s\] conformance/test_fixtures.py::\S+ (PASSED|SKIPPED)",
        (tmp_path / "pytest-cuda.txt").read_text(),
        re.M,
    )
    if not nvidia_smi():
        assert code == 0 and "skipped" in summary and verdict == "nothing checked on a GPU: none found"
    assert capsys.readouterr().out.strip().endswith(f"gpu-check: {verdict}")


def test_a_step_of_the_gpu_run_is_stopped_at_its_time(tmp_path):
    from bert_multi.tools.gpu_run import _stream

    with open(tmp_path / "log", "w") as log, open(tmp_path / "copy", "w") as copy:
        command = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"]
        code, took = _stream(command, 1.0, log, copy, dict(os.environ))
    assert code == 124 and took < 10 and (tmp_path / "copy").read_text() == "started\n"


def test_a_stamped_step_says_when_each_line_came(tmp_path):
    from bert_multi.tools.gpu_run import _stream

    with open(tmp_path / "log", "w") as log, open(tmp_path / "copy", "w") as copy:
        command = [sys.executable, "-c", "import time; print('one', flush=True); time.sleep(1.5); print('two')"]
        code, _ = _stream(command, 30, log, copy, dict(os.environ), stamped=True)
    lines = (tmp_path / "copy").read_text().splitlines()
    assert code == 0 and [line.split("] ", 1)[1] for line in lines] == ["one", "two"]
    first, second = (float(line[1:].split(" s]")[0]) for line in lines)
    assert first < 1.5 <= second


@pytest.mark.parametrize("stand_in", [("torch", None)], indirect=True)
def test_a_bench_stopped_at_the_budget_keeps_the_rows_it_has_and_lists_the_rest(stand_in):
    from bert_multi.tools.gpu_check import BudgetSpent, check_bench

    def step(done, planned, label):  # the budget is spent once the training steps are reached
        if label.startswith("train step"):
            raise BudgetSpent

    kept, rest = check_bench(Setting(True, CONFIGS["tiny"], 1, step), [stand_in], "gpu:0")
    assert kept.status == "PASS" and {row["workload"] for row in kept.data["rows"]} == {"forward tiny 4x16 on gpu:0"}
    assert rest.status == NOT_RUN and rest.detail == (
        "stopped at the budget before train step tiny float32, train step tiny tf32, train step tiny bfloat16"
    )
