"""``bert-multi gpu-check``: run as a GPU machine runs it (from the source tree, ``python -m``, NumPy 2 and
no MXNet), and every check exercised on a stand-in GPU, passing and failing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bert_multi import load_backend, register_backend, unregister_backend
from bert_multi.backend.contract import parse_device
from bert_multi.backend.registry import not_in_process
from bert_multi.tools.gpu_check import nvidia_smi, run_gpu_check

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
        assert done.returncode == (1 if "FAIL" in statuses else 0)


class StandInGPU:
    """A backend of this machine claiming a GPU (its models run on the CPU): every check of gpu-check runs
    on it here, where no GPU is. On the torch backend it trains too."""

    NAME = "standin"
    ROLE = "framework"

    def __init__(self, base="numpy", fault=None):
        self.base, self.fault = load_backend(base), fault
        if self.base.can_train:
            self.Pretrainer = self.base.Pretrainer

    def devices(self):
        return ["cpu", "gpu:0"]

    def build(self, config, weights, device="cpu", dtype="float32", gradients=True, share=False, tf32=False):
        if self.fault and parse_device(device).kind == "gpu":  # a GPU kernel that scales the FFN
            weights = {k: v * (1.01 if ".ffn.dense2." in k else 1) for k, v in weights.items()}
        options = {"gradients": gradients} if self.base.name != "numpy" else {}
        model = self.base.build(config, weights, dtype=dtype, **options)
        recorded = model.framework_info()  # as the CPU model it is
        model.device, model.backend = parse_device(device), self.NAME
        model.framework_info = lambda: {**recorded, "tf32": tf32}
        return model


@pytest.fixture
def stand_in(request):
    base, fault = getattr(request, "param", ("numpy", None))
    if not_in_process(base):
        pytest.skip(not_in_process(base))
    register_backend(StandInGPU(base, fault))
    yield
    unregister_backend("standin")


@pytest.mark.parametrize("stand_in", [("torch", None)], indirect=True)
def test_every_check_runs_on_a_gpu_and_a_conforming_backend_passes(stand_in):
    report = run_gpu_check(quick=True)
    ours = {part.check: part for part in report.parts if part.backend == "standin"}
    presets = ["conformance d2l", "conformance d2l-0.12", "conformance d2l-0.11", "conformance bert"]
    training = ["training float32", "training float64"]
    assert [check for check in ours] == [*presets, "fixtures", "tf32", *training, "bench"]
    assert all(part.status == "PASS" for part in ours.values()), report.table()
    assert "gradients, 3 steps' losses and weights" in ours["training float64"].detail
    # GPU-vs-CPU pairs in both dtypes, and the TF32 setting recorded both ways
    pairs = {check["reference"] for check in ours["conformance d2l"].data["checks"] if "via" in check["reference"]}
    assert pairs and all("standin" in pair for pair in pairs)
    assert [ours["tf32"].data[key]["runtime"]["tf32"] for key in ("off", "on")] == [False, True]
    assert report.verdict().startswith("PASS: all ") and "standin gpu:0" in report.verdict()
    assert "standin gpu:0" in report.environment["devices"]


@pytest.mark.parametrize("stand_in", [("numpy", "scaled FFN")], indirect=True)
def test_a_gpu_that_computes_something_else_fails_and_says_where(stand_in):
    report = run_gpu_check(quick=True)
    failed = {part.check for part in report.failed}
    assert {"conformance d2l", "fixtures", "tf32"} <= failed
    skipped = [part for part in report.parts if part.backend == "standin" and part.status == "SKIP"]
    assert [part.check for part in skipped] == ["training"] and "cannot train" in skipped[0].detail
    assert report.verdict().startswith("FAIL: ") and "standin gpu:0" in report.verdict()


def test_a_report_records_everything_as_json_and_markdown(stand_in, tmp_path):
    from bert_multi.cli import main

    assert main(["gpu-check", "--quick", "--out", str(tmp_path)]) == 0
    document = json.loads((tmp_path / "gpu-check.json").read_text())
    assert document["passed"] and np.isfinite(document["seconds"])
    assert "## bench, standin on gpu:0" in (tmp_path / "gpu-check.md").read_text()


def test_a_check_that_raises_is_a_fail_saying_what_and_the_others_still_run():
    from bert_multi.errors import CannotRunHere
    from bert_multi.tools.gpu_check import Part, _guarded

    backend = load_backend("numpy")

    def breaks():
        yield Part("conformance d2l", "numpy", "gpu:0", "PASS", "fine")
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def cannot():
        raise CannotRunHere("no such device")
        yield

    parts = _guarded("conformance", backend, "gpu:0", breaks) + _guarded("tf32", backend, "gpu:0", cannot)
    assert [(p.check, p.status) for p in parts] == [
        ("conformance d2l", "PASS"),
        ("conformance", "FAIL"),
        ("tf32", "SKIP"),
    ]
    assert parts[1].detail == "raised RuntimeError: CUDA error: an illegal memory access was encountered"
