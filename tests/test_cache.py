"""The compilation cache (``bert_multi.cache``): where it is, how it is turned off, that it changes how long
a run takes, never what it computes, and that an entry it cannot trust is ignored, never run or waited on."""

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import threading
import zlib
from pathlib import Path

import pytest

from bert_multi.backend.registry import backends
from bert_multi.cache import (
    CACHE_VARIABLE,
    ENTRY_SUFFIX,
    EntryRefused,
    NoEntry,
    SealedEntries,
    cache_for,
    cache_root,
    read_entry,
    seal,
)


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
    """Each entry of a JAX cache directory -> when it was last written or read (its modification time)."""
    return {path.name: path.stat().st_mtime_ns for path in directory.glob(f"*{ENTRY_SUFFIX}")}


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
    # The same entries, each read again (a read stamps an entry's last use): every compilation
    # of the warm run came from the cache, and none was added.
    again = last_used(directory / "jax")
    assert again.keys() == used.keys() and all(again[key] > used[key] for key in used)
    off = conform(directory, "--no-cache")
    assert numbers(warm) == numbers(cold) == numbers(off)
    stated = {run["runtime"]["jax float64 cpu"]["compilation cache"] for run in (cold, warm)}
    assert stated == {str(directory / "jax")} and off["runtime"]["jax float64 cpu"]["compilation cache"] == "off"


def python_with_cache(script: str, directory: Path) -> subprocess.CompletedProcess:
    """``script`` run by this environment's Python on this tree with its cache in ``directory``; it must
    end well."""
    environment = {**os.environ, CACHE_VARIABLE: str(directory), "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=environment)
    assert done.returncode == 0, done.stderr
    return done


# What a user's factory compiles (Flax's initializers, a second or so each on a CPU) is kept as well:
# verify loads the backend of each framework the model's file imported before it calls the factory.
USERS_FACTORY = """
import flax
import jax
from bert_multi import verify

seen = []

def build(config):
    seen.append(jax.config.jax_compilation_cache_dir)
    raise RuntimeError("enough")

try:
    verify(build, "tiny")
except Exception as error:
    assert "enough" in str(error), error
print(seen)
"""


def test_a_users_flax_factory_compiles_with_the_cache_in_place(tmp_path):
    pytest.importorskip("jax")
    assert python_with_cache(USERS_FACTORY, tmp_path).stdout.strip() == repr([str(tmp_path / "jax")])


# --- Entries that cannot be trusted ----------------------------------------------------------------------


def test_an_entry_is_its_keys_value_and_nothing_else_reads_as_one(tmp_path):
    value = bytes(range(256)) * 4
    entry = tmp_path / "entry"
    entry.write_bytes(seal("jit_a-1", value))
    assert read_entry(entry, "jit_a-1") == value
    with pytest.raises(EntryRefused, match="another program"):
        read_entry(entry, "jit_b-2")
    sealed = seal("jit_a-1", value)
    for cut in range(0, len(sealed), 97):  # cut short anywhere, as a file-size limit or a crash leaves it
        entry.write_bytes(sealed[:cut])
        with pytest.raises(EntryRefused):
            read_entry(entry, "jit_a-1")
    for at in (len(sealed) - 1, len(sealed) - len(value) // 2):  # one byte of the program changed
        entry.write_bytes(sealed[:at] + bytes([sealed[at] ^ 1]) + sealed[at + 1 :])
        with pytest.raises(EntryRefused, match="do not match its seal"):
            read_entry(entry, "jit_a-1")
    entry.write_bytes(zlib.compress(bytes(50 << 20)))  # an entry as JAX writes it: never decompressed here
    with pytest.raises(EntryRefused, match="not a sealed"):
        read_entry(entry, "jit_a-1")


def test_an_entry_that_is_not_a_small_regular_file_is_refused_without_being_read_or_waited_on(tmp_path):
    (tmp_path / "real").write_bytes(seal("k", b"v"))
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.mkfifo(tmp_path / "fifo")  # no writer: a blocking read would wait for ever
    with open(tmp_path / "sparse", "wb") as file:  # 1.2 GiB that takes no room on disk
        file.truncate(1_200 << 20)
    refused = {}

    def read_each():
        for name in ("link", "fifo", "sparse"):
            with pytest.raises(EntryRefused) as caught:
                read_entry(tmp_path / name, "k")
            refused[name] = str(caught.value)

    reader = threading.Thread(target=read_each, daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), f"a read waited on a special file; refused so far: {refused}"
    assert "cannot open it" in refused["link"] and "not a regular file" in refused["fifo"]
    assert "over the" in refused["sparse"]
    with pytest.raises(NoEntry):
        read_entry(tmp_path / "absent", "k")


def test_the_store_ignores_a_wrong_entry_once_says_so_once_and_replaces_it(tmp_path, capsys):
    store = SealedEntries(tmp_path / "jax")
    store.put("jit_one-1", b"one")
    store.put("jit_two-2", b"two")
    assert (store.get("jit_one-1"), store.get("jit_two-2"), store.get("jit_three-3")) == (b"one", b"two", None)
    one, two = store._path("jit_one-1"), store._path("jit_two-2")
    swapped = one.read_bytes()
    one.write_bytes(two.read_bytes())
    two.write_bytes(swapped)  # entries rotated between programs
    assert store.get("jit_one-1") is None and store.get("jit_two-2") is None
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and "another program" in said[0] and str(one) in said[0], said
    store.put("jit_one-1", b"one")  # compiled afresh, kept again
    assert store.get("jit_one-1") == b"one" and capsys.readouterr().err == ""
    assert sorted(path.name for path in (tmp_path / "jax").iterdir()) == sorted([".lock", one.name, two.name])


def test_the_store_keeps_at_most_its_bound_least_recently_used_out_first(tmp_path):
    entry_bytes = len(seal("jit_0-0", bytes(1000)))
    store = SealedEntries(tmp_path, max_bytes=3 * entry_bytes)
    for index in range(3):
        store.put(f"jit_{index}-{index}", bytes(1000))
        os.utime(store._path(f"jit_{index}-{index}"), ns=(index * 10**9, index * 10**9))
    assert store.get("jit_0-0") is not None  # read: now the most recently used
    store.put("jit_3-3", bytes(1000))
    kept = {key for key in ("jit_0-0", "jit_1-1", "jit_2-2", "jit_3-3") if store._path(key).exists()}
    assert kept == {"jit_0-0", "jit_2-2", "jit_3-3"}
    assert sum(path.stat().st_size for path in tmp_path.glob(f"*{ENTRY_SUFFIX}")) <= store.max_bytes


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    store = SealedEntries(tmp_path)

    def disk_full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    store.put("jit_a-1", b"value")
    assert store.get("jit_a-1") is None
    assert [path.name for path in tmp_path.iterdir()] == [".lock"]
    assert "No space left on device" in capsys.readouterr().err


def test_a_lock_held_elsewhere_is_waited_on_for_a_bounded_time(tmp_path, monkeypatch, capsys):
    store = SealedEntries(tmp_path)
    store.put("jit_a-1", b"value")
    monkeypatch.setattr("bert_multi.cache.LOCK_TIMEOUT_SECONDS", 0.05)
    with open(tmp_path / ".lock", "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert store.get("jit_a-1") is None
    assert "lock was held" in capsys.readouterr().err
    assert store.get("jit_a-1") == b"value"


def test_a_directory_others_may_write_to_is_not_used(tmp_path, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    store = SealedEntries(shared)
    store.put("jit_a-1", b"value")
    assert store.get("jit_a-1") is None and list(shared.iterdir()) == []
    assert "may write to it (mode 777)" in capsys.readouterr().err


JITTED = textwrap.dedent(
    """
    import bert_multi.jax.backend, jax, jax.numpy as jnp
    print([float(jax.jit(lambda x: x * 2 + 1)(jnp.float32(3))), float(jax.jit(lambda x: x * 3 - 1)(jnp.float32(3)))])
    """
)


def test_jax_computes_its_own_programs_whatever_the_cache_holds(tmp_path):
    pytest.importorskip("jax")

    def run():
        done = python_with_cache(JITTED, tmp_path)
        return json.loads(done.stdout), done.stderr

    assert run() == ([7.0, 8.0], "")
    entries = sorted((tmp_path / "jax").glob("jit__lambda*"))
    assert len(entries) == 2
    first, second = (path.read_bytes() for path in entries)
    entries[0].write_bytes(second)
    entries[1].unlink()
    os.mkfifo(entries[1])
    computed, said = run()
    assert computed == [7.0, 8.0], "a program ran another's executable from the cache"
    assert "another program" in said and "not a regular file" in said
    assert run() == ([7.0, 8.0], "")  # both entries were replaced by what JAX compiled
