"""The command line as a person uses it: conform, compare, fixtures, and their failures."""

import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hostile import npz_member

from bert_multi import CONFIGS, backends, frameworks, random_weights, save_weights
from bert_multi.backend.registry import load_backend, not_in_process
from bert_multi.cli import main
from bert_multi.engine.cases import CASES
from bert_multi.errors import UsageError
from bert_multi.tools.fixtures import FIXTURE_CONFIGS

FRAMEWORKS = [name for name in ("torch", "mxnet") if not not_in_process(name)]
needs_framework = pytest.mark.skipif(not FRAMEWORKS, reason="no framework backend is installed")


@needs_framework
def test_conform_prints_a_table_and_writes_json_and_a_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    code = main(["conform", "--config", "tiny", "--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")])
    out = capsys.readouterr().out
    assert code == 0, out
    header = next(line for line in out.splitlines() if line.startswith("target"))
    for column in ("compared with", "output", "max abs err", "atol / rtol", "margin", "result"):
        assert column in header
    assert "PASS:" in out and "FAIL" not in out
    assert max(map(len, out.splitlines())) <= 100  # the default report fits a 100-column terminal
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passed"] and report["config"] == CONFIGS["tiny"].to_dict()
    assert {check["target"].split()[0] for check in report["checks"]} == {
        n for n in frameworks() if backends()[n].available
    }
    assert all("threads" in info for info in report["runtime"].values())
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_error_plot_of_a_deep_model_stays_a_readable_size(tmp_path):
    """Twelve blocks, as BERT-base has: at most 14 inches at 110 dpi, one panel per dtype, whatever the depth."""
    pytest.importorskip("matplotlib")
    import struct

    from bert_multi import BERTConfig
    from bert_multi.engine.conform import run_conformance
    from bert_multi.engine.report import plot_report
    from bert_multi.engine.results import Target

    config = BERTConfig(vocab_size=11, num_hiddens=4, ffn_num_hiddens=6, num_heads=2, num_blks=12, max_len=8)
    targets = [Target("numpy", dtype) for dtype in ("float32", "float64")]
    cases = [CASES[0].input(config)]
    report = run_conformance(config, random_weights(config), targets, cases, pairs=False)
    png = plot_report(report, tmp_path / "deep.png").read_bytes()
    width, height = struct.unpack(">II", png[16:24])
    assert width <= 14 * 110 and height < width, (width, height)


@pytest.mark.skipif("torch" not in FRAMEWORKS, reason="needs the torch backend")
def test_wide_shows_the_relative_errors_and_how_each_reference_got_its_weights(capsys):
    argv = ["conform", "--config", "tiny", "--backends", "numpy,torch", "--cases", "batch_one", "--wide"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("backend"))
    for column in ("dtype", "device", "compared with", "max abs err", "max rel err", "tolerance", "margin"):
        assert column in header
    assert "(weights via memory, bit-exact)" in out


@pytest.mark.skipif("torch" not in FRAMEWORKS, reason="needs the torch backend")
def test_conform_fails_with_exit_1_and_names_the_layer(monkeypatch, capsys):
    import torch

    import bert_multi.torch.model as model

    monkeypatch.setattr(
        model.PositionWiseFFN, "forward", lambda self, X: self.dense2(torch.nn.functional.gelu(self.dense1(X)))
    )
    assert (
        main(["conform", "--config", "tiny", "--backends", "torch", "--dtypes", "float64", "--cases", "batch_one"]) == 1
    )
    out = capsys.readouterr().out
    assert "FAIL torch vs oracle: first divergence at 'blks.0.ffn' in 1 of 1 case (batch_one), float64 on cpu" in out
    assert "     worst, case batch_one in float64: blks.0.ffn: FAIL, max abs " in out
    assert "FAIL: 0 of 4 comparisons within tolerance, each the worst of 1 case(s)" in out  # the 4 rows shown


@pytest.mark.cuda
@pytest.mark.skipif("torch" not in FRAMEWORKS, reason="needs the torch backend")
def test_a_device_missing_here_is_reported_as_skipped(capsys):
    import torch

    code = main(["conform", "--config", "tiny", "--backends", "torch", "--devices", "cpu,cuda", "--cases", "batch_one"])
    out = capsys.readouterr().out
    assert code == 0
    if not torch.cuda.is_available():
        assert "SKIP: device cuda:0 asked for, but this PyTorch" in out


def test_nothing_checked_is_a_failure(capsys):
    assert main(["conform", "--config", "tiny", "--backends", "numpy", "--devices", "cuda"]) == 1
    assert "nothing was checked" in capsys.readouterr().err


@needs_framework
def test_compare_on_the_users_own_weights_and_inputs(tmp_path, capsys):
    config = CONFIGS["tiny"]
    save_weights(tmp_path / "mine.npz", config, random_weights(config, seed=7))
    np.savez(
        tmp_path / "batch.npz",
        tokens=np.array([[3, 4, 5]]),
        segments=np.array([[0, 1, 1]]),
        valid_lens=np.array([2.0]),
        pred_positions=np.array([[2, 0]]),
    )
    assert main(["compare", str(tmp_path / "mine.npz"), "--inputs", str(tmp_path / "batch.npz")]) == 0
    assert "cases: batch" in capsys.readouterr().out
    np.savez(tmp_path / "bad.npz", tokens=np.array([[3, 400]]), segments=np.array([[0, 1]]))
    assert main(["compare", str(tmp_path / "mine.npz"), "--inputs", str(tmp_path / "bad.npz")]) == 2
    assert "tokens[0, 1] = 400 is out of range" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["conform", "--backends", "tensorflow"], "unknown backend 'tensorflow'"),
        (["conform", "--backends", "numpy,tourch"], "unknown backend 'tourch' (did you mean 'torch'?)"),
        (["conform", "--reference", "torch"], "--reference 'torch': expected one of the references ['transformers']"),
        (["pretrain", "--backend", "numpy"], "backend 'numpy' cannot train: it has no Pretrainer"),
        (["conform", "--dtypes", "float16"], "unknown dtype 'float16'"),
        (["conform", "--devices", "tpu"], "unknown device 'tpu'"),
        (["conform", "--cases", "nope"], "unknown case 'nope'"),
        (["conform", "--config", "missing.npz"], "neither a built-in config"),
        (["compare", "missing.npz"], "no such checkpoint"),
    ],
)
def test_mistakes_are_explained_with_exit_2_before_anything_runs(argv, message, capsys):
    assert main(argv) == 2
    shown = capsys.readouterr()
    assert message in shown.err and shown.out == ""


def test_list_cases(capsys):
    assert main(["conform", "--list-cases"]) == 0
    assert "valid_len_zero" in capsys.readouterr().out


def test_fixtures_command_writes_small_files(tmp_path, capsys):
    assert main(["fixtures", "--dir", str(tmp_path)]) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(f"{name}.{kind}.npz" for name in FIXTURE_CONFIGS for kind in ("cases", "weights"))
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) < 640_000


SMALL_MODEL = ["--batch-size", "8", "--num-hiddens", "8", "--ffn-num-hiddens", "8", "--max-len", "32"]


@needs_framework
def test_pretrain_prints_losses_and_saves_loadable_weights(tmp_path, capsys):
    from bert_multi import load_weights

    (tmp_path / "corpus.txt").write_text(
        "\n".join(
            f"the cat {w} the dog . the dog {w} the bird . a bird {w} the cat ." for w in ("sees", "finds", "likes") * 4
        )
    )
    out = tmp_path / "w.npz"
    assert (
        main(
            [
                "pretrain",
                "--backend",
                FRAMEWORKS[0],
                "--steps",
                "2",
                "--corpus",
                str(tmp_path / "corpus.txt"),
                "--out",
                str(out),
                *SMALL_MODEL,
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "step    2/2  loss" in printed and "tokens/s" in printed and "threads" in printed
    config, weights = load_weights(out)
    assert config.num_hiddens == 8 and config.max_len == 32 and config.vocab_size < 20


def test_pretrain_in_mixed_precision_says_so_and_a_framework_without_it_is_refused_first(tmp_path, capsys):
    if not backends()["torch"].available or not backends()["mxnet"].available:
        pytest.skip("needs torch and mxnet")
    out = tmp_path / "w.npz"
    arguments = ["pretrain", "--steps", "2", "--mixed-precision", "bfloat16", "--out", str(out), *SMALL_MODEL]
    assert main([*arguments, "--backend", "torch"]) == 0
    assert "float32 (bfloat16 products) on cpu:" in capsys.readouterr().out and out.exists()
    assert main([*arguments, "--backend", "mxnet"]) == 2
    printed = capsys.readouterr()
    assert "backend 'mxnet' trains in its weights' dtype only; mixed precision (bfloat16) is offered by ['torch']" in (
        printed.err
    )
    assert "corpus:" not in printed.out  # refused before the data and the model


def test_data_parallel_pretraining_of_a_framework_elsewhere_runs_the_same_command_in_its_environment(
    monkeypatch, capsys
):
    """From .venv, ``pretrain --backend jax --workers 2`` (or ``--join``) is the user's very command, run
    by .venv-numpy2's Python: every option kept, its exit status this one's."""
    elsewhere = [name for name in frameworks() if backends()[name].available and not_in_process(name)]
    if not elsewhere:
        pytest.skip("every framework runs in this environment")
    from bert_multi.cli import common

    ran = []
    monkeypatch.setattr(
        common.subprocess, "run", lambda command, env: ran.append(command) or SimpleNamespace(returncode=3)
    )
    for option in (["--workers", "2"], ["--join"]):
        argv = ["pretrain", "--backend", elsewhere[0], *option, "--steps", "7", "--out", "w.npz", *SMALL_MODEL]
        assert main(argv) == 3
        assert ran.pop() == [str(load_backend(elsewhere[0]).elsewhere), "-m", "bert_multi.cli", *argv]
        assert "this command runs there" in capsys.readouterr().out


@pytest.mark.skipif(len(FRAMEWORKS) < 2, reason="needs both frameworks")
def test_pretrain_compare_shows_both_curves(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert (
        main(
            [
                "pretrain",
                "--compare",
                "--steps",
                "3",
                "--dtype",
                "float64",
                "--adam-epsilon-style",
                "torch",
                "--plot",
                str(tmp_path / "curves.png"),
                *SMALL_MODEL,
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    trained = [name for name in frameworks() if backends()[name].available and load_backend(name).can_train]
    assert "  ".join(f"{name} loss" for name in trained) + "  largest difference" in printed
    for other in trained[1:]:  # Adam's epsilon placed alike: one verdict per pair, that they trained alike
        assert re.search(rf"{trained[0]} and {other}: .* what rounding leaves in float64: they trained alike", printed)
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


# --- Failures are one line, exit 2, and come before any work ----------------------------------------


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if the command starts its work before refusing."""
    from bert_multi.cli import common, fixtures, pretrain

    def refuse(*args, **kwargs):
        pytest.fail("the work started before the bad argument was reported")

    for module, name in (
        (common, "run_conformance"),
        (common, "load_checkpoint"),
        (pretrain, "run_pretraining"),
        (fixtures, "write_fixtures"),
    ):
        monkeypatch.setattr(module, name, refuse)


def one_line_error(capsys):
    """The one line of error on standard error, besides the lines of progress a log gets (``[  0 s] ...``)."""
    err = "".join(line for line in capsys.readouterr().err.splitlines(True) if not re.match(r"\[ *\d+ s\] ", line))
    assert err.count("\n") == 1 and err.startswith("bert-multi: error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["conform", "--json", "{missing}/r.json"], "the directory '{missing}' does not exist"),
        (["conform", "--plot", "{missing}/r.png"], "the directory '{missing}' does not exist"),
        (["conform", "--json", "{tmp}"], "is a directory; expected a file name"),
        (["compare", "w.npz", "--json", "{missing}/r.json"], "the directory '{missing}' does not exist"),
        (["pretrain", "--out", "{missing}/w.npz"], "the directory '{missing}' does not exist"),
        (["pretrain", "--compare", "--plot", "{missing}/c.png"], "the directory '{missing}' does not exist"),
        (["fixtures", "--dir", "{file}/sub"], "cannot write in"),
        (["fixtures", "--dir", "{file}"], "exists and is not a directory"),
        (["conform", "--json", "{dangling}"], "the directory '{missing}' does not exist"),  # where the link leads
        (["conform", "--json", "{socket}"], "is neither a file, a device nor a FIFO"),
    ],
)
def test_an_unwritable_output_path_is_refused_before_the_work(argv, message, tmp_path, capsys, no_work):
    (tmp_path / "file").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing" / "r.json")
    with socket.socket(socket.AF_UNIX) as bound:  # its file stays, a socket
        bound.bind(str(tmp_path / "socket"))
    names = {"missing": str(tmp_path / "missing"), "tmp": str(tmp_path), "file": str(tmp_path / "file")}
    names |= {"dangling": str(tmp_path / "dangling"), "socket": str(tmp_path / "socket")}
    assert main([arg.format(**names) for arg in argv]) == 2
    assert message.format(**names) in one_line_error(capsys)


def test_hostile_weights_files_are_one_line_errors(tmp_path, capsys):
    from hostile import hostile_weights

    for case, (data, expected) in hostile_weights().items():
        (tmp_path / "w.npz").write_bytes(data)
        for command in (["compare", str(tmp_path / "w.npz")], ["conform", "--config", str(tmp_path / "w.npz")]):
            assert main(command) == 2, case
            assert expected in one_line_error(capsys), case


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.write_bytes(npz_member(np.zeros((1, 3), int))), "holds a single array"),
        (lambda p: p.mkdir(), "is a directory; expected a file of inputs (.npz)"),
        (lambda p: None, "no such file of inputs (.npz)"),
        (lambda p: p.write_bytes(b"tokens"), "not a readable .npz file"),
    ],
)
def test_a_bad_inputs_file_is_a_one_line_error(make, message, tmp_path, capsys):
    config = CONFIGS["tiny"]
    save_weights(tmp_path / "w.npz", config, random_weights(config))
    make(tmp_path / "batch.npz")
    assert main(["compare", str(tmp_path / "w.npz"), "--inputs", str(tmp_path / "batch.npz")]) == 2
    assert message in one_line_error(capsys)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, "no such corpus file"),
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_bytes(b"caf\xe9 . bar ."), "the corpus is not UTF-8 text"),
    ],
)
def test_a_bad_corpus_is_a_one_line_error(make, message, tmp_path, capsys, no_work):
    make(tmp_path / "corpus.txt")
    assert main(["pretrain", "--corpus", str(tmp_path / "corpus.txt")]) == 2
    assert message in one_line_error(capsys)


@pytest.mark.skipif("torch" not in FRAMEWORKS, reason="needs the torch backend")
def test_an_activation_the_backend_never_recorded_is_a_fail_row_with_exit_1(monkeypatch, capsys):
    import bert_multi.torch.backend as torch_backend

    forward = torch_backend.TorchBERT._forward

    def forgetful(self, inputs, intermediates):
        out = forward(self, inputs, intermediates)
        out.intermediates["blks.1.ffn"] = None
        return out

    monkeypatch.setattr(torch_backend.TorchBERT, "_forward", forgetful)
    code = main(["conform", "--config", "tiny", "--backends", "torch", "--dtypes", "float64", "--cases", "batch_one"])
    out = capsys.readouterr().out
    assert code == 1
    assert "first divergence at 'blks.1.ffn'" in out and "the compared side has no value" in out, out


# --- Generations on the command line ------------------------------------------------------------------


@pytest.mark.skipif("torch" not in FRAMEWORKS, reason="needs the torch backend")
def test_conform_runs_every_generation_with_preset_all(tmp_path, capsys):
    argv = ["conform", "--config", "tiny", "--preset", "all", "--backends", "torch", "--cases", "mixed_valid_lens"]
    assert main([*argv, "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    for heading in ("preset d2l (d2l 0.16 - 1.0)", "preset d2l-0.12 (d2l 0.12 - 0.15 (MXNet))", "preset d2l-0.11",
                    "preset bert (the original BERT"):  # fmt: skip
        assert f"== {heading}" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert sorted(report) == ["bert", "d2l", "d2l-0.11", "d2l-0.12"]
    assert report["d2l-0.11"]["config"]["semantics"]["positions"] == "sinusoidal"


@pytest.mark.skipif("torch" not in FRAMEWORKS, reason="needs the torch backend")
def test_compare_reads_a_files_generation_and_can_be_told_another(tmp_path, capsys):
    config = CONFIGS["tiny"].with_semantics("0.14.4")
    save_weights(tmp_path / "old.npz", config, random_weights(config, seed=3))
    assert main(["compare", str(tmp_path / "old.npz"), "--backends", "torch", "--no-pairs"]) == 0
    assert "semantics='d2l-0.12'" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "old.npz"), "--backends", "torch", "--preset", "1.0.3", "--no-pairs"]) == 0
    assert "semantics='d2l'" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "old.npz"), "--preset", "d2l-0.11"]) == 2
    assert (
        "the file's weights (d2l-0.12) do not fit the stated generation 'd2l-0.11': missing tensor(s)"
        in one_line_error(capsys)
    )
    assert main(["conform", "--config", str(tmp_path / "old.npz"), "--preset", "all"]) == 2
    assert "--preset all needs a built-in --config" in one_line_error(capsys)


@needs_framework
def test_pretrain_takes_a_preset_and_can_freeze_the_positions(tmp_path, capsys):
    out = tmp_path / "w.npz"
    argv = ["pretrain", "--backend", FRAMEWORKS[0], "--steps", "2", "--out", str(out), *SMALL_MODEL]
    assert main([*argv, "--preset", "0.11.4"]) == 0
    from bert_multi import load_weights

    assert load_weights(out)[0].semantics.name == "d2l-0.11"
    assert main([*argv, "--preset", "0.11.4", "--freeze-positions"]) == 2
    assert "no positional embeddings to freeze" in one_line_error(capsys)


def test_bench_quick_runs_every_backend_of_this_environment_and_writes_json(tmp_path, capsys):
    """Speed is shown by the benchmark, never asserted: this checks that it runs and what it writes."""
    assert main(["bench", "--quick", "--no-compile", "--json", str(tmp_path / "bench.json")]) == 0
    document = json.loads((tmp_path / "bench.json").read_text())
    rows = document["rows"]
    here = {name for name in backends() if not not_in_process(name)}  # one run by a worker is timed at home
    assert {row["backend"].split()[0] for row in rows if row["workload"].startswith("forward")} == here
    files = {(row["workload"], row["backend"]) for row in rows if "weights" in row["workload"]}
    assert files == {
        ("save weights tiny", "save_weights"),
        ("save weights tiny", "np.savez + fsync"),
        ("save weights tiny", "np.savez"),
        ("load weights tiny", "load_weights"),
        ("load weights tiny", "np.load"),
    }
    for row in rows:
        assert len(row["seconds"]) == 2 and row["min_s"] <= row["median_s"] <= row["max_s"]
        model = "weights" not in row["workload"]
        assert (row["tokens_per_s"] or 0) > 0 if model else row["megabytes_per_s"] > 0
        assert (row["peak_share"] is None) == (not row["workload"].startswith("forward"))
        assert row["peak_source"] == ("same-process GEMM" if row["peak_share"] is not None else None)
        assert (row["first_s"] is not None) == model and (not model or row["first_s"] > 0)
    printed = capsys.readouterr()
    assert "tokens/s" in printed.out and "threads" in document["threads"]
    for name in {name for name in frameworks() if backends()[name].available} - here:  # said, not left out silently
        assert f"not timed here: {name} runs in another environment" in printed.out
    # A line as each workload starts, and one for each row as its workload ends, which a log keeps (no
    # terminal here, so no bar: the progress helper's own lines, "[  0 s] ...", are beside them).
    lines = [line.removeprefix("bench: ") for line in printed.err.splitlines() if line.startswith("bench: ")]
    started = [line.split(" (")[0] for line in lines if line.endswith(" s in)")]
    expected = {f"{row['workload']} {row['dtype']}" if row["tokens_per_s"] else row["workload"] for row in rows}
    assert len(started) == len(expected) and set(started) == expected
    told = [line.split(": ")[0] for line in lines if not line.endswith(" s in)")]
    assert sorted(told) == sorted(f"{row['workload']} {row['dtype']}, {row['backend']}" for row in rows)
    trained = {row["backend"] for row in rows if row["workload"].startswith("train step")}
    assert trained == {name for name in here if load_backend(name).can_train}
    # Each model workload against its fastest framework: that one at 1, every other row at its own ratio.
    for workload in {(row["workload"], row["dtype"]) for row in rows if row["tokens_per_s"]}:
        timed = [row for row in rows if (row["workload"], row["dtype"]) == workload]
        fastest = min(row["median_s"] for row in timed if row["backend"].split()[0] in frameworks())
        for row in timed:
            assert row["against_fastest"] == pytest.approx(row["median_s"] / fastest)
    assert document["goal"] == 1.15 and document["verdict"].endswith(".")


def test_bench_times_a_backend_that_can_compile_both_ways(tmp_path, monkeypatch):
    """A backend whose build takes ``compile`` gets a compiled row beside its plain one, built with
    compile=True; ``--no-compile`` leaves it out. (The oracle stands in for a compiling framework.)"""
    from bert_multi import register_backend, unregister_backend

    oracle, asked = load_backend("numpy"), []

    def build(config, weights, device="cpu", dtype="float32", gradients=True, compile=False):
        asked.append(compile)
        return oracle.build(config, weights, device, dtype)

    register_backend(SimpleNamespace(NAME="compiling", build=build))
    try:
        argv = ["bench", "--quick", "--no-train", "--no-files", "--dtypes", "float64", "--backends", "compiling"]
        for extra, rows_expected in (([], ["compiling", "compiling compiled"]), (["--no-compile"], ["compiling"])):
            asked.clear()
            assert main([*argv, *extra, "--json", str(tmp_path / "b.json")]) == 0
            rows = json.loads((tmp_path / "b.json").read_text())["rows"]
            assert [row["backend"] for row in rows] == rows_expected
            assert asked == [False, True][: len(rows_expected)]
            assert all(row["first_s"] > 0 and len(row["seconds"]) == 2 for row in rows)
    finally:
        unregister_backend("compiling")


def test_the_goal_verdict_names_each_framework_behind_the_fastest():
    from bert_multi.tools.bench import Row, against_fastest, goal_verdict

    def timed(backend, median):
        return Row("forward chapter 8x64", backend, "float32", [median], 512, 1.0, None)

    rows = against_fastest(
        [timed("torch", 1.0), timed("torch compiled", 0.5), timed("mxnet", 0.55), timed("numpy", 0.1)]
    )
    # The fastest framework's variant sets the mark; the oracle is shown against it but never sets it.
    assert [row.against_fastest for row in rows] == pytest.approx([2.0, 1.0, 1.1, 0.2])
    assert goal_verdict(rows) == (
        "Every framework's best variant is within 1.15x of the fastest framework on the one workload timed."
    )
    behind = goal_verdict(against_fastest([timed("torch", 1.0), timed("mxnet", 1.3)]))
    assert behind.endswith("fastest framework: MXNet/Gluon 1.30x on forward chapter 8x64 float32.")


def test_bench_times_the_backends_asked_for_and_refuses_one_it_cannot_time(tmp_path, capsys):
    argv = ["bench", "--quick", "--no-files", "--no-train", "--dtypes", "float64"]
    assert main([*argv, "--backends", "numpy", "--json", str(tmp_path / "b.json")]) == 0
    assert {row["backend"] for row in json.loads((tmp_path / "b.json").read_text())["rows"]} == {"numpy"}
    assert main([*argv, "--backends", "nmupy"]) == 2
    assert "unknown backend 'nmupy' (did you mean 'numpy'?)" in capsys.readouterr().err
    elsewhere = next((name for name in frameworks() if not_in_process(name)), None)
    if elsewhere is not None:
        assert main([*argv, "--backends", elsewhere]) == 2
        assert "bench times the backends of this environment only" in capsys.readouterr().err


def test_bench_on_a_gpu_that_no_backend_can_use_says_so(capsys):
    from bert_multi.tools.gpu_check import nvidia_smi

    if nvidia_smi():
        pytest.skip("a GPU is here: tests/test_gpu_check.py times it")
    assert main(["bench", "--quick", "--devices", "cuda", "--backends", "numpy"]) == 1  # nothing found, as everywhere
    captured = capsys.readouterr()
    assert "nothing timed on cuda: no backend of this environment can use it" in captured.out
    assert "bert-multi: nothing was timed on cuda" in captured.err
    assert main(["bench", "--quick", "--devices", "tpu"]) == 2
    assert "unknown device 'tpu'" in capsys.readouterr().err


def test_bench_verify_times_verify_beside_a_plain_forward(tmp_path):
    if not backends()["torch"].available:
        pytest.skip(backends()["torch"].reason)
    argv = ["bench", "--quick", "--verify", "--no-train", "--no-files", "--no-compile", "--dtypes", "float64"]
    assert main([*argv, "--json", str(tmp_path / "bench.json")]) == 0
    rows = [row for row in json.loads((tmp_path / "bench.json").read_text())["rows"] if "verify" in row["workload"]]
    names = ["plain forward (torch)", "conform --no-pairs (torch)", "verify", "verify --gradients"]
    assert [row["backend"] for row in rows] == names
    assert all(len(row["seconds"]) == 2 and row["min_s"] > 0 and row["threads"] for row in rows)


@pytest.mark.parametrize(
    "raised, shown",
    [
        (UsageError("--x and --y cannot go together"), True),
        (PermissionError(13, "Permission denied", "out.json"), True),  # a path: one line
        (ValueError("a bug's ValueError"), False),
        (OSError(5, "Input/output error"), False),  # no path: not the user's to fix (a full disk is the machine's)
        (RuntimeError("a bug"), False),
    ],
    ids=lambda value: type(value).__name__,
)
def test_the_projects_own_errors_are_one_line_and_a_bug_says_it_is_one(monkeypatch, capsys, raised, shown):
    """Either way the status is 2, never 1 (which says that a model does not conform); a bug says it is the
    project's, in one line naming the file that holds its traceback, for a report."""
    from bert_multi.cli import backends as command

    def fail(args):
        raise raised

    monkeypatch.setattr(command, "run", fail)
    assert main(["backends"]) == 2
    line = one_line_error(capsys).rstrip()
    if shown:
        assert line.endswith(str(raised).split(": ")[-1])
    else:
        assert line.startswith("bert-multi: error: an internal error, a bug in bert_multi and not in your model")
        assert f"{type(raised).__name__}: {raised}" in line
        saved = Path(re.search(r"its traceback is in (\S+):", line)[1])
        text = saved.read_text()
        saved.unlink()
        assert text.startswith("bert-multi backends\n") and "raise raised" in text and "Traceback" in text


def test_compare_ends_with_one_sentence_and_shows_the_table_on_request(tmp_path, capsys):
    path = tmp_path / "mine.npz"
    save_weights(path, CONFIGS["tiny"], random_weights(CONFIGS["tiny"], seed=4))
    argv = ["compare", str(path), "--backends", "numpy", "--cases", "batch_one,max_len"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"{path}: NumPy computes what the float64 oracle computes, on 2 cases: largest difference")
    assert last.endswith("every one of 8 comparisons within tolerance (--details: the table)")
    assert "max abs err" not in out and "dropout" not in out  # no table; no dropout the file never recorded
    assert "cases: batch_one, max_len\n" in out
    assert main([*argv, "--details"]) == 0
    detailed = capsys.readouterr().out
    assert "max abs err" in detailed and detailed.count(" PASS\n") == 8  # the 8 comparisons the sentence counts
    assert main([*argv, "--inputs", str(path)]) == 2
    assert "--cases chooses among the built-in cases" in capsys.readouterr().err
    assert main(["compare", str(path), "--cases", "batch_two"]) == 2
    assert "unknown case 'batch_two'" in capsys.readouterr().err


@pytest.mark.parametrize("option", [["--preset", "0.18"], ["--d2l-version", "0.99"], ["--d2l-version", "1.5"]])
def test_a_release_d2l_never_made_is_refused_before_a_file_is_compared(tmp_path, capsys, option):
    """A Flax file of a d2l BERT (its names fit two generations): stating one that d2l never released is
    a one-line error naming the releases each generation covers, never a PASS."""
    from bert_multi import BERTConfig, random_weights, save_checkpoint

    config = BERTConfig(11, 4, 6, 2, 1, max_len=6)
    save_checkpoint(tmp_path / "w.msgpack", config, random_weights(config), framework="jax")
    assert main(["compare", str(tmp_path / "w.msgpack"), "--num-heads", "2", *option]) == 2
    error = capsys.readouterr().err
    assert "is no release with BERT's chapter" in error and "0.16.0 - 1.0.3 (preset d2l)" in error


ELSEWHERE = [name for name in frameworks() if backends()[name].available and not_in_process(name)]


@pytest.mark.skipif(not ELSEWHERE, reason="no backend runs in another environment's worker here")
def test_a_run_with_a_worker_beside_it_shares_the_cores(tmp_path, monkeypatch):
    """Where a worker runs beside this process, this process's frameworks start with half the cores
    (``OMP_NUM_THREADS``, unless the user set it), as the report says, and NumPy's BLAS, loaded before,
    is set to them too; alone, the user's environment is left as it is."""
    import os
    import subprocess
    import sys

    from threadpoolctl import threadpool_info

    from bert_multi.backend.registry import processes_for
    from bert_multi.cli.common import cores_shared
    from bert_multi.engine.results import Target

    def numpy_blas_threads():
        """The threads of each BLAS NumPy loaded (as the oracle computes with)."""
        pools = [pool for pool in threadpool_info() if pool["user_api"] == "blas" and "numpy" in pool["filepath"]]
        assert pools, threadpool_info()
        return [pool["num_threads"] for pool in pools]

    assert processes_for(["torch"]) == 1 and processes_for(["torch", ELSEWHERE[0]]) == 2
    cores = os.cpu_count() or 1
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "bert_multi.cli", "conform", "--backends", f"torch,{ELSEWHERE[0]}"]
    command += ["--dtypes", "float32", "--cases", "batch_one", "--config", "tiny", "--json", str(report)]
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    subprocess.run(command, env=env, check=True, capture_output=True)
    assert json.loads(report.read_text())["runtime"]["torch float32 cpu"]["threads"] == max(1, cores // 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    alone, pair = [Target("torch", "float32")], [Target("torch", "float32"), Target(ELSEWHERE[0], "float32")]
    with cores_shared(alone):
        assert "OMP_NUM_THREADS" not in os.environ
    before = numpy_blas_threads()
    with cores_shared(pair):
        assert os.environ["OMP_NUM_THREADS"] == str(max(1, cores // 2))
        assert set(numpy_blas_threads()) == {max(1, cores // 2)}
    assert "OMP_NUM_THREADS" not in os.environ  # a caller in the same process keeps its environment
    assert numpy_blas_threads() == before
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with cores_shared(pair):
        assert os.environ["OMP_NUM_THREADS"] == "3"  # the user's own setting


ENDING = """
import atexit, logging, sys
from bert_multi.display import printable_output
from bert_multi.ending import end_process
handled, lines = sys.argv[1:]
atexit.register(lambda: open(handled, "w").write("ran"))
class Closing(logging.StreamHandler):  # as absl's handler closes a stream that is not sys.stderr now
    def close(self):
        self.stream.close()
with printable_output():  # a handler made meanwhile holds the wrapper, which logging's exit handler closes
    logging.getLogger("x").addHandler(Closing())
print("line\\n" * int(lines), end="")
end_process(3)
"""


def test_a_command_ends_with_its_status_its_output_out_and_its_exit_handlers_run(tmp_path):
    """The command skips the interpreter's teardown (``bert_multi.ending``), not what an exit owes: the
    exit handlers run, standard output, buffered into a pipe, arrives whole, and the status is the
    command's, even where an exit handler closed standard error first."""
    import subprocess
    import sys

    handled = tmp_path / "handled"
    ended = subprocess.run([sys.executable, "-c", ENDING, str(handled), "100000"], capture_output=True, timeout=60)
    assert (ended.returncode, ended.stderr, handled.read_text()) == (3, b"", "ran")
    assert ended.stdout == b"line\n" * 100_000


READER_GONE = """
import atexit, sys
from bert_multi.ending import end_process
atexit.register(lambda: open(sys.argv[1], "w").write("ran"))
print("line\\n" * 100, end="")  # held in the buffer: standard output is a pipe
sys.stdin.readline()  # until the reader has gone, as `| head` goes
end_process(3)
"""


def test_a_command_whose_reader_has_gone_ends_with_its_status_and_no_traceback(tmp_path):
    """What is still buffered when the reader has gone (``bert-multi conform | head``) cannot go out: the
    command ends as it would have, its status its own, its exit handlers run, nothing on standard error."""
    import os
    import subprocess
    import sys

    handled = tmp_path / "handled"
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    buffered = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    with subprocess.Popen([sys.executable, "-c", READER_GONE, str(handled)], env=buffered, **pipes) as child:
        child.stdout.close()
        child.stdin.write(b"go\n")
        child.stdin.close()
        stderr = child.stderr.read()
        assert (child.wait(60), stderr, handled.read_text()) == (3, b"", "ran")


def test_standard_output_on_a_full_disk_is_one_line_not_a_bug_report():
    with open("/dev/full", "w") as full:  # every write: ENOSPC
        done = subprocess.run([sys.executable, "-m", "bert_multi.cli", "backends"], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120, cwd=Path(__file__).parents[1])  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == "bert-multi: error: No space left on device: the output could not be written\n"
