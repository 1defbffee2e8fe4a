"""The compilation cache (``bert_multi.cache``): where it is, how it is turned off, and that it changes how
long a run takes, never what it computes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bert_multi.backend.registry import backends
from bert_multi.cache import CACHE_VARIABLE, cache_for, cache_root


def test_the_cache_is_in_the_users_cache_directory_unless_told_otherwise(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_for("jax") == tmp_path / "xdg" / "bert_multi" / "jax"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "bert_multi"
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "mine"))
    assert cache_for("torch") == tmp_path / "mine" / "torch"
    for off in ("none", "None", " none "):
        monkeypatch.setenv(CACHE_VARIABLE, off)
        assert cache_root() is None and cache_for("jax") is None


def test_a_cache_directory_under_a_user_that_does_not_exist_is_taken_as_written(monkeypatch, tmp_path):
    """As a shell leaves ``~nobody_here/...`` as written: never a traceback, ``--help`` included."""
    monkeypatch.chdir(tmp_path)
    for variable in (CACHE_VARIABLE, "XDG_CACHE_HOME"):
        monkeypatch.delenv(CACHE_VARIABLE, raising=False)
        monkeypatch.setenv(variable, "~no_such_user_of_bert_multi/cache")
        expected = tmp_path / "~no_such_user_of_bert_multi" / "cache"
        assert cache_root() == (expected if variable == CACHE_VARIABLE else expected / "bert_multi")
        environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
        command = [sys.executable, "-m", "bert_multi.cli", "--help"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=environment)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def conform(directory, *extra):
    """``conform --backends jax`` (in this process's environment or its worker) with the cache in
    ``directory``: its JSON report."""
    report = directory.parent / f"report-{len(list(directory.parent.glob('report-*')))}.json"
    done = subprocess.run(
        [sys.executable, "-m", "bert_multi.cli", "conform", "--backends", "jax", "--config", "tiny"]
        + ["--cases", "mixed_valid_lens,valid_lens_2d,max_len", "--json", str(report), *extra],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, CACHE_VARIABLE: str(directory)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(report.read_text())


def last_used(directory):
    """Each entry of a JAX cache directory -> when it was last written or read (JAX's own stamp)."""
    return {path.name: int.from_bytes(path.read_bytes(), "little") for path in directory.glob("*-atime")}


def numbers(report):
    """Every difference the run measured, in its order: what a cache must not change."""
    return [json.dumps(check, sort_keys=True) for check in report["checks"]]


def test_a_warm_cache_computes_exactly_what_a_cold_one_and_none_compute(tmp_path):
    if not backends()["jax"].available:
        pytest.skip(backends()["jax"].reason)
    directory = tmp_path / "cache"
    cold = conform(directory)
    used = last_used(directory / "jax")
    assert used, "the cold run kept nothing"
    warm = conform(directory)
    # The same entries, each read again (JAX stamps an entry's last use when it reads it): every compilation
    # of the warm run came from the cache, and none was added.
    again = last_used(directory / "jax")
    assert again.keys() == used.keys() and all(again[key] > used[key] for key in used)
    off = conform(directory, "--no-cache")
    assert numbers(warm) == numbers(cold) == numbers(off)
    stated = {run["runtime"]["jax float64 cpu"]["compilation cache"] for run in (cold, warm)}
    assert stated == {str(directory / "jax")} and off["runtime"]["jax float64 cpu"]["compilation cache"] == "off"
