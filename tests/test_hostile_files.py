"""Every hostile file is a clean error, in bounded time and memory, for every reader.

Files are loaded in a child process with an address-space cap (``hostile.probe_in_child``), so that a
regression that crashes, hangs or allocates what a header claims fails here instead of taking the test
run down. The reproducers are the ones the readers once failed on; the fuzzer looks for new ones.
"""

import os

import pytest
from hostile import HOSTILE, fuzz_in_child, probe_in_child

from bert_multi import backends

# Readers and the frameworks they need. "mxnet" is the MXNet backend's load_checkpoint on the .params
# reproducers: it must never hand a file to MXNet's own C++ reader, which crashes on some of them.
READERS = {"weights": None, "params": None, "inputs": None, "torch": "torch", "mxnet": "mxnet"}
REPRODUCERS = {"mxnet": "params"}  # which set of reproducers a reader is given
FUZZ_SECONDS = float(os.environ.get("BERT_MULTI_FUZZ_SECONDS", "12"))
FUZZ_SEED = int(os.environ.get("BERT_MULTI_FUZZ_SEED", "0"))


def skip_without(reader):
    framework = READERS[reader]
    if framework and not backends()[framework].available:
        pytest.skip(backends()[framework].reason)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Each reader's outcome on each of its reproducers, one child process per reader."""
    results = {}

    def run(reader):
        if reader not in results:
            cases = HOSTILE[REPRODUCERS.get(reader, reader)]()
            directory = tmp_path_factory.mktemp(reader)
            paths = []
            for number, (data, _) in enumerate(cases.values()):
                paths.append(directory / f"case{number}.bin")
                paths[-1].write_bytes(data)
            results[reader] = dict(zip(cases, zip(probe_in_child(reader, paths), (e for _, e in cases.values()))))
        return results[reader]

    return run


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reproducer_is_refused_with_a_message_that_says_why(reader, outcomes):
    skip_without(reader)
    failures = []
    for case, (result, expected) in outcomes(reader).items():
        if result["outcome"] != "refused" or expected not in result["message"]:
            failures.append(f"{case}: {result}\n    expected a refusal mentioning {expected!r}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_fuzzing_finds_no_file_that_escapes(reader, tmp_path):
    skip_without(reader)
    report = fuzz_in_child(reader, FUZZ_SECONDS, FUZZ_SEED, tmp_path)
    assert report["outcomes"]["refused"] > 0  # the fuzzer did produce hostile files ...
    escapes = [f"{e['type']}: {e['message']} ({e['file']})\n{e['traceback']}" for e in report["escapes"]]
    assert not escapes, f"{len(escapes)} file(s) escaped with another exception:\n" + "\n".join(escapes[:3])


@pytest.fixture
def odd_paths(tmp_path):
    """Paths that are not regular files, or that the system cannot open."""
    fifo = tmp_path / "fifo.npz"
    os.mkfifo(fifo)
    (tmp_path / "directory.npz").mkdir()
    return {
        "a FIFO": (fifo, "not a regular file"),
        "a directory": (tmp_path / "directory.npz", "is a directory"),
        "a missing file": (tmp_path / "missing.npz", "no such"),
        "a 300-character name": (tmp_path / ("x" * 300), "cannot open"),
    }


@pytest.mark.parametrize("reader", sorted(READERS))
def test_paths_that_are_not_regular_files_are_refused_without_blocking(reader, odd_paths):
    skip_without(reader)
    results = probe_in_child(reader, [path for path, _ in odd_paths.values()], timeout=60)
    for (case, (_, expected)), result in zip(odd_paths.items(), results):
        assert result["outcome"] == "refused" and expected in result["message"], (case, result)
