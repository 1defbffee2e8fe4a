"""Every hostile file is a clean error, in bounded time and memory, for every reader.

Files are loaded in a child process with an address-space cap (``hostile.probe_in_child``), so that a
regression that crashes, hangs or allocates what a header claims fails here instead of taking the test
run down. The reproducers are the ones the readers once failed on; the fuzzer looks for new ones.
"""

import io
import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hostile import HOSTILE, LOADERS, fuzz_in_child, npy_bytes, probe_in_child, weights_bytes, with_manifest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import conftest
from bert_multi import WeightsError, load_weights
from bert_multi.backend.registry import not_in_process

# Every loader of hostile.py is tried here (one list, its LOADERS), in the environments that have the
# framework it needs, if any. "mxnet" is the MXNet backend's load_checkpoint on the .params reproducers: it
# must never hand a file to MXNet's own C++ reader, which crashes on some of them.
READERS = sorted(LOADERS)
FRAMEWORK_NEEDED = {"torch": "torch", "deepspeed": "torch", "mxnet": "mxnet"}  # DeepSpeed's model states: PyTorch's
REPRODUCERS = {
    "mxnet": "params",
    "safetensorsfile": "safetensors",
    "h5alone": "hfh5",
}  # which set of reproducers a reader is given
# `make test` runs this file in both environments: each fuzzes a reader for half of its 4 s, from a seed
# of its own (NumPy's major version is added), so that the two halves search different files.
FUZZ_SECONDS = float(os.environ.get("BERT_MULTI_FUZZ_SECONDS", "2"))
FUZZ_SEED = int(os.environ.get("BERT_MULTI_FUZZ_SEED", "0")) + int(np.__version__.split(".")[0])


def skipped(reader):
    """Why ``reader`` is not tried here, or None: its framework is not in this process, or another
    environment of the run tries it (conftest.py's ``tested_elsewhere``)."""
    framework = FRAMEWORK_NEEDED.get(reader)
    if framework is None:
        return None
    return conftest.run_elsewhere({framework}, conftest.tested_elsewhere()) or not_in_process(framework)


def skip_without(reader):
    reason = skipped(reader)
    if reason:
        pytest.skip(reason)


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


@pytest.mark.parametrize("reader", READERS)
def test_every_reproducer_is_refused_with_a_message_that_says_why(reader, outcomes):
    skip_without(reader)
    failures = []
    for case, (result, expected) in outcomes(reader).items():
        if isinstance(expected, dict):  # the bare reader and the checkpoint loader that sniffs first
            expected = expected[reader]
        if result["outcome"] != "refused" or expected not in result["message"]:
            failures.append(f"{case}: {result}\n    expected a refusal mentioning {expected!r}")
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    """Each reader's fuzzing report, or the error its child ended with: the readers this process has,
    fuzzed side by side, as many children at a time as there are cores (each runs on one), so that each
    reader still gets FUZZ_SECONDS of a core."""
    readers = [reader for reader in READERS if not skipped(reader)]
    directories = {reader: tmp_path_factory.mktemp(f"fuzz-{reader}") for reader in readers}

    def fuzz(reader):
        try:
            return fuzz_in_child(reader, FUZZ_SECONDS, FUZZ_SEED, directories[reader])
        except AssertionError as error:  # a crash or a hang, raised in that reader's test
            return error

    with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        return dict(zip(readers, pool.map(fuzz, readers)))


@pytest.mark.parametrize("reader", READERS)
def test_fuzzing_finds_no_file_that_escapes(reader, fuzzed):
    skip_without(reader)
    report = fuzzed[reader]
    if isinstance(report, AssertionError):
        raise report
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


@pytest.mark.parametrize("reader", READERS)
def test_paths_that_are_not_regular_files_are_refused_without_blocking(reader, odd_paths):
    skip_without(reader)
    results = probe_in_child(reader, [path for path, _ in odd_paths.values()], timeout=60)
    for (case, (_, expected)), result in zip(odd_paths.items(), results):
        assert result["outcome"] == "refused" and expected in result["message"], (case, result)


# --- Hypothesis: the parsers' contracts on generated fields ------------------------------------------
# These parse headers and small files in this process: nothing here allocates what a header declares,
# which the child-process tests above guard.

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
DESCRS = st.sampled_from(["<f4", ">f8", "<f2", "|u1", "<i8", "|O", "V8", "<c16", "|b1", "<U3", "x", ""])
# The sizes that break parsers: zero, negative, and just past 31, 32, 62 and 63 bits.
DIMENSIONS = st.sampled_from([0, 1, 3, -1, -2, 2**31, 2**32, 2**62, 2**63 - 1])


@settings(max_examples=300, deadline=None)
@given(
    descr=DESCRS,
    fortran=st.booleans(),
    shape=st.lists(DIMENSIONS | st.integers(), max_size=4).map(tuple),
    version=st.sampled_from([(1, 0), (2, 0), (3, 0), (0, 0)]),
)
def test_any_npy_header_parses_within_its_limits_or_is_a_value_error(descr, fortran, shape, version):
    from bert_multi.safe_files import MAX_NPY_HEADER_BYTES, parse_npy_header

    stream = io.BytesIO(
        npy_bytes(repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode(), b"", version)
    )
    try:
        header = parse_npy_header(stream.read)
    except ValueError:
        return
    assert not header.dtype.hasobject and all(isinstance(n, int) and n >= 0 for n in header.shape)
    assert header.data_offset <= 12 + MAX_NPY_HEADER_BYTES and header.nbytes >= 0


@pytest.fixture(scope="module")
def valid_weights_file():
    return weights_bytes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_manifest_loads_or_is_a_weights_error(valid_weights_file, tmp_path, data):
    field = data.draw(
        st.sampled_from(["config", "format", "format_version", "dtype", "tensors", "whole", "a config field"])
    )
    value = data.draw(JSON)

    def edit(manifest):
        if field == "whole":
            return json.dumps(value)
        if field == "a config field":
            manifest["config"][data.draw(st.sampled_from(sorted(manifest["config"])))] = value
        else:
            manifest[field] = value

    (tmp_path / "w.npz").write_bytes(with_manifest(valid_weights_file, edit))
    try:
        load_weights(tmp_path / "w.npz")
    except WeightsError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    magic=st.sampled_from([0xF993FAC9, 0xF993FACA, 0xF993FACA, 0xF993FAC8]),
    storage=st.sampled_from([0, 0, 0, 1, -1]),
    shape=st.lists(DIMENSIONS, max_size=4),
    ndim_delta=st.integers(-1, 1),
    flag=st.integers(-1, 13),
    payload=st.binary(max_size=64),
    names=st.lists(st.binary(max_size=6), max_size=3),
)
def test_any_params_record_loads_or_is_a_weights_error(
    tmp_path, magic, storage, shape, ndim_delta, flag, payload, names
):
    from bert_multi.files.formats.gluon import read_params

    record = struct.pack("<Iii", magic, storage, len(shape) + ndim_delta) + struct.pack(f"<{len(shape)}q", *shape)
    record += struct.pack("<iii", 1, 0, flag) + payload
    tail = struct.pack("<Q", len(names)) + b"".join(struct.pack("<Q", len(n)) + n for n in names)
    (tmp_path / "x.params").write_bytes(struct.pack("<QQQ", 0x112, 0, 1) + record + tail)
    try:
        arrays = read_params(tmp_path / "x.params")
    except WeightsError:
        return
    assert len(arrays) == 1 and all(isinstance(a, np.ndarray) for a in arrays.values())


# --- Writes: nothing earlier is lost, and a failure is one line -------------------------------------------


def under_a_file_size_limit(limit, *command):
    """``command`` (Python's arguments) run by a Python whose writes past ``limit`` bytes fail with EFBIG
    (Python ignores SIGXFSZ): the limit is set before it execs, not in a fork of this threaded process."""
    import sys

    setup = (
        f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )
    return [sys.executable, "-c", setup, *command]


@pytest.mark.once  # the operating system's limit on a write, the same in every environment
def test_a_conversion_past_a_file_size_limit_keeps_the_earlier_file_and_says_so_in_one_line(tmp_path):
    import subprocess

    from bert_multi import BERTConfig, random_weights, save_weights

    config = BERTConfig(50, 16, 24, 2, 2, max_len=16)
    save_weights(tmp_path / "w.npz", config, random_weights(config))
    earlier = b"an earlier file, kept whole"
    (tmp_path / "out.msgpack").write_bytes(earlier)
    command = ["-m", "bert_multi.cli", "convert", str(tmp_path / "w.npz"), str(tmp_path / "out.msgpack")]
    done = subprocess.run(under_a_file_size_limit(4096, *command), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"bert-multi: error: [Errno 27] File too large, writing it (any earlier file is kept): "
        f"'{tmp_path / 'out.msgpack'}'"
    )
    assert (tmp_path / "out.msgpack").read_bytes() == earlier
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.msgpack", "w.npz"]


@pytest.mark.once  # the operating system's limit on a write, the same in every environment
def test_notebooks_past_a_file_size_limit_leave_the_earlier_ones_whole(tmp_path):
    """``lessons --notebooks`` into a directory of earlier notebooks, each write cut off by the limit."""
    import subprocess

    code = (
        "import sys\n"
        "from bert_multi.tools import lessons, notebooks\n"
        "sections = [s for s in lessons.read_guide() if s.number == 5]\n"
        "try:\n"
        "    notebooks.write_notebooks(sections, sys.argv[1], lambda samples: [lessons.Outcome(s, s.expected) for s "
        "in samples])\n"
        "except OSError as error:\n"
        "    print(error)\n"
    )
    earlier = "x" * 4000
    names = ["05-repeat-means-opposite-things-torch.ipynb"]
    for name in names:
        (tmp_path / name).write_text(earlier)
    done = subprocess.run(
        under_a_file_size_limit(1024, "-c", code, str(tmp_path)), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "File too large, writing it (any earlier file is kept)" in done.stdout and names[0] in done.stdout
    assert (tmp_path / names[0]).read_text() == earlier
    assert sorted(path.name for path in tmp_path.iterdir()) == names


def test_names_from_a_file_reach_the_terminal_as_text_not_as_escape_sequences(tmp_path):
    import subprocess
    import sys

    from hostile import CONFIG

    from bert_multi import random_weights
    from bert_multi.files.formats.flax import flax_tree, pack_tree

    name = "classifier\x1b[2J\x07.kernel"

    tree = flax_tree(CONFIG, random_weights(CONFIG))
    tree[name] = np.zeros(2, np.float32)
    (tmp_path / "w.msgpack").write_bytes(pack_tree(tree))
    done = subprocess.run(
        [sys.executable, "-m", "bert_multi.cli", "inspect", str(tmp_path / "w.msgpack")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    # No framework names a tensor so: refused where it is read, the name shown as text in one line.
    assert done.returncode == 2, done.stderr
    assert not {"\x1b", "\x07"} & set(done.stdout + done.stderr) and done.stderr.count("\n") == 1
    assert r"'classifier\x1b[2J\x07.kernel', with the control character \x1b" in done.stderr
