import dataclasses
import errno
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bert_multi.safe_files as files
import bert_multi.spec.weight_file as weights_module
from bert_multi import (
    BERTConfig,
    WeightsError,
    init_weights,
    load_weights,
    random_weights,
    save_checkpoint,
    save_weights,
)
from bert_multi.files.formats import DIRECTORY_FRAMEWORKS, LIBRARY_DIRECTORIES
from bert_multi.spec.weight_file import FORMAT_VERSION, make_manifest, write_npz

CONFIG = BERTConfig(vocab_size=13, num_hiddens=6, ffn_num_hiddens=10, num_heads=2, num_blks=2, max_len=9)


@pytest.fixture
def weights():
    return random_weights(CONFIG, seed=1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_round_trip_is_bit_identical(tmp_path, dtype):
    original = random_weights(CONFIG, seed=2, dtype=dtype)
    path = save_weights(tmp_path / "model.npz", CONFIG, original)
    config, loaded = load_weights(path)
    assert config == CONFIG
    assert list(loaded) == list(original)
    for name in original:
        assert loaded[name].dtype == original[name].dtype
        assert loaded[name].tobytes() == original[name].tobytes(), name


def test_saving_keeps_the_users_file_name(tmp_path, weights):
    save_weights(tmp_path / "checkpoint.weights", CONFIG, weights)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.weights"]


def manifest_of(weights, **changes):
    return {**make_manifest(CONFIG, weights, "float32"), **changes}


def write_then_load(path, manifest, arrays):
    write_npz(path, manifest, arrays)
    return load_weights(path)


def without(mapping, key):
    return {k: v for k, v in mapping.items() if k != key}


def test_missing_tensor(tmp_path, weights):
    partial = without(weights, "mlm.mlp.2.weight")
    with pytest.raises(WeightsError, match=r"missing tensor\(s\) \['mlm.mlp.2.weight'\]"):
        write_then_load(tmp_path / "w.npz", make_manifest(CONFIG, partial, "float32"), partial)


def test_extra_tensor(tmp_path, weights):
    more = {**weights, "encoder.blks.2.ffn.dense1.bias": weights["encoder.blks.1.ffn.dense1.bias"]}
    with pytest.raises(WeightsError, match=r"unexpected tensor\(s\) \['encoder.blks.2.ffn.dense1.bias'\]"):
        write_then_load(tmp_path / "w.npz", make_manifest(CONFIG, more, "float32"), more)


def test_misshaped_tensor(tmp_path, weights):
    bad = {**weights, "encoder.pos_embedding": weights["encoder.pos_embedding"][:, :5]}
    with pytest.raises(WeightsError, match=r"'encoder.pos_embedding' has shape \(1, 5, 6\), expected \(1, 9, 6\)"):
        write_then_load(tmp_path / "w.npz", make_manifest(CONFIG, bad, "float32"), bad)


def test_wrongly_typed_tensor(tmp_path, weights):
    bad = {**weights, "hidden.0.bias": weights["hidden.0.bias"].astype(np.float16)}
    with pytest.raises(WeightsError, match=r"'hidden.0.bias' has dtype float16, the manifest says float32"):
        write_then_load(tmp_path / "w.npz", make_manifest(CONFIG, bad, "float32"), bad)


def test_non_finite_tensor(tmp_path, weights):
    bad = {**weights, "nsp.output.bias": np.array([0.5, np.inf], dtype=np.float32)}
    with pytest.raises(WeightsError, match=r"'nsp.output.bias' has a non-finite value inf at index \(1,\)"):
        write_then_load(tmp_path / "w.npz", make_manifest(CONFIG, bad, "float32"), bad)


def test_tampered_tensor_fails_its_checksum(tmp_path, weights):
    manifest = manifest_of(weights)
    tampered = {
        **weights,
        "encoder.blks.1.attention.W_v.weight": weights["encoder.blks.1.attention.W_v.weight"] * 1.001,
    }
    with pytest.raises(WeightsError, match=r"'encoder.blks.1.attention.W_v.weight' fails its SHA-256 check"):
        write_then_load(tmp_path / "w.npz", manifest, tampered)


def test_flipped_byte_in_the_file_is_caught(tmp_path, weights):
    path = save_weights(tmp_path / "w.npz", CONFIG, weights)
    data = bytearray(path.read_bytes())
    # Flip one byte inside the token embedding's data; the zip CRC or the SHA-256 must catch it.
    offset = data.index(weights["encoder.token_embedding.weight"].tobytes()[:32]) + 8
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(WeightsError, match="encoder.token_embedding.weight"):
        load_weights(path)


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_members_read_as_numpy_reads_them_and_a_flipped_byte_fails_the_crc(tmp_path, compressed):
    arrays = {"a": np.arange(300_000, dtype=np.float64).reshape(600, 500), "b": np.ones(3, np.int32)}
    path = tmp_path / "x.npz"
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    limit = 10**8 if compressed else None

    def read_all():
        with open(path, "rb") as file:
            reader = files.NpzReader(file, path, WeightsError, max_compressed_bytes=limit)
            return {name: reader.read(name, reader.header(name)) for name in reader.names}

    assert all(np.array_equal(read_all()[name], arrays[name]) for name in arrays)
    if compressed:
        return  # a flipped byte in deflated data is zlib's to catch; a stored member is bert_multi's
    data = bytearray(path.read_bytes())
    data[data.index(arrays["a"].tobytes()[8:40]) + 1000] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(WeightsError, match=r"array 'a' is unreadable: BadZipFile: Bad CRC-32 for file 'a.npy'"):
        read_all()


def test_a_tensor_in_another_layout_is_hashed_and_written_as_its_c_ordered_copy(tmp_path):
    """A transposed tensor (as a Flax kernel is exported) is hashed and written a few rows at a time:
    the digest and the file's bytes are those of its C-ordered copy, in any number of pieces."""
    import hashlib
    import io

    kernel = np.random.default_rng(0).standard_normal((300, 2000))  # 4.8 MB: ten pieces and more
    for array in (kernel.T, kernel.T.astype(">f8"), kernel[::2, ::3], np.asfortranarray(kernel[:7, :5])):
        copy = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        assert weights_module.tensor_sha256(array) == hashlib.sha256(copy.tobytes()).hexdigest()
        written = io.BytesIO()
        weights_module.write_archive(written, {"w": array})
        read = np.load(io.BytesIO(written.getvalue()))["w"]
        assert read.flags.c_contiguous and read.dtype == array.dtype and np.array_equal(read, array)
    assert kernel.T.nbytes > 8 * weights_module.PIECE_BYTES


def test_truncated_file(tmp_path, weights):
    path = save_weights(tmp_path / "w.npz", CONFIG, weights)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(WeightsError, match=r"not a readable .npz file \(truncated or corrupt\?\)"):
        load_weights(path)


def test_missing_manifest(tmp_path, weights):
    np.savez(tmp_path / "plain.npz", **weights)
    with pytest.raises(WeightsError, match="no '__manifest__' entry"):
        load_weights(tmp_path / "plain.npz")


def test_unreadable_manifest(tmp_path, weights):
    np.savez(tmp_path / "w.npz", __manifest__=np.frombuffer(b"{not json", dtype=np.uint8), **weights)
    with pytest.raises(WeightsError, match="the manifest is unreadable"):
        load_weights(tmp_path / "w.npz")


def test_pickled_manifest_is_refused_without_unpickling(tmp_path, weights):
    np.savez(tmp_path / "w.npz", __manifest__=np.array([{"format": "x"}], dtype=object), **weights)
    with pytest.raises(WeightsError, match="the manifest is unreadable"):
        load_weights(tmp_path / "w.npz")


def test_pickled_tensor_is_refused_without_unpickling(tmp_path, weights):
    manifest = np.frombuffer(json.dumps(manifest_of(weights)).encode(), dtype=np.uint8)
    # np.savez pickles an object array; bert_multi's writer never writes one.
    np.savez(tmp_path / "w.npz", __manifest__=manifest, **{**weights, "hidden.0.bias": np.array([object()] * 6)})
    with pytest.raises(WeightsError, match="'hidden.0.bias' is unreadable"):
        load_weights(tmp_path / "w.npz")


def test_future_format_version(tmp_path, weights):
    with pytest.raises(WeightsError, match=f"format version {FORMAT_VERSION + 1} is newer than this bert_multi reads"):
        write_then_load(tmp_path / "w.npz", manifest_of(weights, format_version=FORMAT_VERSION + 1), weights)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"format": "safetensors"}, "manifest format is 'safetensors'"),
        ({"format_version": "1"}, "format_version is '1', expected a positive int"),
        ({"dtype": "bfloat16"}, "manifest dtype is 'bfloat16'"),
        ({"config": {"vocab_size": 13}}, "the manifest's config is invalid"),
        ({"tensors": ["a"]}, "must map each tensor name to its SHA-256"),
    ],
)
def test_bad_manifest_fields(tmp_path, weights, changes, message):
    with pytest.raises(WeightsError, match=message):
        write_then_load(tmp_path / "w.npz", manifest_of(weights, **changes), weights)


def test_manifest_missing_a_field(tmp_path, weights):
    with pytest.raises(WeightsError, match="the manifest has no 'dtype' field"):
        write_then_load(tmp_path / "w.npz", without(manifest_of(weights), "dtype"), weights)


def test_manifest_and_file_disagree_on_tensors(tmp_path, weights):
    with pytest.raises(WeightsError, match=r"\['hidden.0.bias'\] are listed in the manifest but missing"):
        write_then_load(tmp_path / "w.npz", manifest_of(weights), without(weights, "hidden.0.bias"))
    manifest = manifest_of(weights)
    manifest["tensors"] = without(manifest["tensors"], "hidden.0.bias")
    with pytest.raises(WeightsError, match=r"\['hidden.0.bias'\] are in the file but not in its manifest"):
        write_then_load(tmp_path / "w.npz", manifest, weights)


def test_manifest_config_decides_the_schema(tmp_path, weights):
    manifest = manifest_of(weights, config={**CONFIG.to_dict(), "num_blks": 1})
    with pytest.raises(WeightsError, match=r"unexpected tensor\(s\) \['encoder.blks.1"):
        write_then_load(tmp_path / "w.npz", manifest, weights)


def test_not_a_file(tmp_path):
    with pytest.raises(WeightsError, match="no such weights file"):
        load_weights(tmp_path / "nope.npz")
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(WeightsError, match="not an .npz archive"):
        load_weights(tmp_path / "single.npy")


def test_save_refuses_what_load_would_reject(tmp_path, weights):
    path = save_weights(tmp_path / "w.npz", CONFIG, weights)
    before = path.read_bytes()
    bad = {**weights, "hidden.0.weight": np.full((6, 6), np.nan, dtype=np.float32)}
    with pytest.raises(WeightsError, match="'hidden.0.weight' has a non-finite value"):
        save_weights(path, CONFIG, bad)
    with pytest.raises(WeightsError, match="config must be a BERTConfig"):
        save_weights(path, CONFIG.to_dict(), weights)
    assert path.read_bytes() == before


def test_a_crash_mid_write_leaves_the_earlier_file_intact(tmp_path, weights, monkeypatch):
    path = save_weights(tmp_path / "w.npz", CONFIG, weights)
    before = path.read_bytes()

    def write_then_crash(file, arrays):
        file.write(b"PK\x03\x04 half an archive")
        raise KeyboardInterrupt("simulated crash")

    monkeypatch.setattr(weights_module, "write_archive", write_then_crash)
    with pytest.raises(KeyboardInterrupt):
        save_weights(path, CONFIG, init_weights(CONFIG, seed=9))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.npz"]  # no temporary file left behind
    monkeypatch.undo()
    assert load_weights(path)[1].keys() == weights.keys()


def test_manifest_is_human_readable(tmp_path, weights):
    path = save_weights(tmp_path / "w.npz", CONFIG, weights)
    with np.load(path, allow_pickle=False) as archive:
        manifest = json.loads(archive["__manifest__"].tobytes())
    assert manifest["format"] == "bert_multi.weights" and manifest["dtype"] == "float32"
    assert manifest["config"] == CONFIG.to_dict()
    assert len(manifest["tensors"]) == len(weights)


# --- Arrays in any layout NumPy accepts -------------------------------------------------------------


def test_big_endian_and_reversed_arrays_round_trip_to_native_arrays(tmp_path, weights):
    odd = {name: array.astype(array.dtype.newbyteorder(">")) for name, array in weights.items()}
    odd["hidden.0.weight"] = weights["hidden.0.weight"][::-1, ::-1].copy()[::-1, ::-1]  # negative strides
    _, loaded = load_weights(save_weights(tmp_path / "w.npz", CONFIG, odd))
    for name, array in loaded.items():
        assert array.dtype.isnative and array.dtype == weights[name].dtype, name
        assert np.array_equal(array, weights[name]), name
    # The digests are of the values, so the same weights in either byte order carry the same manifest.
    _, native = load_weights(save_weights(tmp_path / "native.npz", CONFIG, weights))
    assert all(np.array_equal(native[name], loaded[name]) for name in weights)


def test_a_masked_array_is_refused_even_when_its_mask_hides_a_nan(tmp_path, weights):
    from bert_multi import load_backend

    hidden = np.ma.masked_invalid(np.array([np.nan, 1, 2, 3, 4, 5], dtype=np.float32))
    masked = {**weights, "hidden.0.bias": hidden}
    with pytest.raises(WeightsError, match="'hidden.0.bias' is a masked array"):
        save_weights(tmp_path / "w.npz", CONFIG, masked)
    with pytest.raises(WeightsError, match="'hidden.0.bias' is a masked array"):
        load_backend("numpy").build(CONFIG, masked)
    assert not (tmp_path / "w.npz").exists()


def test_a_directory_the_user_may_not_read_is_a_weights_error(tmp_path, monkeypatch, weights):
    path = save_weights(tmp_path / "w.npz", CONFIG, weights)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(files.os, "open", refuse)
    with pytest.raises(WeightsError, match="cannot open the weights file: Permission denied"):
        load_weights(path)


# --- Saving: atomic, durable, and leaving nothing behind ---------------------------------------------


def test_the_temporary_file_is_written_beside_the_target(tmp_path, monkeypatch, weights):
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(files.os, "replace", lambda src, dst: renames.append((src, dst)) or real_replace(src, dst))
    save_weights(tmp_path / "w.npz", CONFIG, weights)
    [(source, target)] = renames
    # A rename is atomic only within one filesystem: the temporary file must be in the target's directory.
    assert Path(source).parent == Path(target).parent == tmp_path
    assert Path(source).name.startswith(".w.npz.") and Path(source).name.endswith(".tmp")


@pytest.fixture(params=[True, False], ids=["unnamed file", "named file"])
def either_way(request, monkeypatch, tmp_path):
    """Saves through an unnamed file (O_TMPFILE, where the filesystem has it) and through a named one."""
    if request.param and files.unnamed_file(tmp_path) is None:
        pytest.skip("this system or filesystem has no unnamed files (O_TMPFILE)")
    monkeypatch.setattr(files, "UNNAMED_WRITES", request.param)


def test_permissions_follow_the_umask_then_the_earlier_file(tmp_path, weights, either_way):
    path = tmp_path / "w.npz"
    old_umask = os.umask(0o022)
    try:
        save_weights(path, CONFIG, weights)
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # as for any file this user creates
        for mode in (0o600, 0o664):
            path.chmod(mode)
            save_weights(path, CONFIG, weights)
            assert stat.S_IMODE(path.stat().st_mode) == mode  # overwriting keeps the file's mode
    finally:
        os.umask(old_umask)


def test_saving_through_a_symbolic_link_replaces_its_target_and_keeps_the_link(tmp_path, weights, either_way):
    target = save_weights(tmp_path / "real.npz", CONFIG, init_weights(CONFIG, seed=3))
    link = tmp_path / "link.npz"
    link.symlink_to(target)
    save_weights(link, CONFIG, weights)
    assert link.is_symlink() and link.resolve() == target
    assert all(np.array_equal(load_weights(target)[1][n], weights[n]) for n in weights)


def test_a_device_or_a_fifo_is_written_to_as_a_stream_never_replaced(tmp_path, either_way):
    """``/dev/null`` stays the system's device (run as root, a rename would replace it), a FIFO stays a
    FIFO and its reader gets what was written; a directory is refused, naming it."""
    files.replace_text("/dev/null", "nothing\n")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    files.replace_text(fifo, "through the pipe\n")
    assert reader.communicate(timeout=30)[0] == b"through the pipe\n"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and [p.name for p in tmp_path.iterdir()] == ["pipe"]
    with pytest.raises(IsADirectoryError, match=f"is a directory; expected a file name to write: '{tmp_path}'"):
        files.replace_text(tmp_path, "x")


def test_the_file_and_its_directory_are_fsynced_before_save_returns(tmp_path, monkeypatch, weights, either_way):
    synced = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append("directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", spy)
    save_weights(tmp_path / "w.npz", CONFIG, weights)
    assert synced == ["file", "directory"]
    assert [p.name for p in tmp_path.iterdir()] == ["w.npz"]


def _failing_fsync(monkeypatch, fail_at: int | None) -> list[int]:
    """``os.fsync`` failing as a full disk or a bad sector does (EIO), at the ``fail_at``-th file it syncs
    (None: never); the returned list counts the files synced."""
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISREG(os.fstat(fd).st_mode):
            synced.append(fd)
            if len(synced) == fail_at:
                raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    return synced


@pytest.mark.parametrize("framework", DIRECTORY_FRAMEWORKS)
def test_a_directory_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch, framework, either_way):
    """Every directory a save writes (d2l's, with its vocab.json, and each library's, with its config.json)
    is left exactly as it was by a save that fails at any of its files, and with nothing beside them."""
    config = dataclasses.replace(CONFIG, semantics="bert") if framework in LIBRARY_DIRECTORIES else CONFIG
    directory = tmp_path / "model"

    def save(seed):
        vocab = [f"token{seed}.{i}" for i in range(config.vocab_size)]
        save_checkpoint(directory, config, random_weights(config, seed=seed), framework=framework, vocab=vocab)

    def contents():
        return {path.name: path.read_bytes() for path in directory.iterdir()}

    save(1)
    before = contents()
    with monkeypatch.context() as patched:
        synced = _failing_fsync(patched, None)
        save(2)
    saved = contents()
    assert saved.keys() == before.keys() and saved != before and len(synced) >= len(saved) >= 2
    for fail_at in range(1, len(synced) + 1):
        with monkeypatch.context() as patched, pytest.raises(OSError, match="Input/output error"):
            _failing_fsync(patched, fail_at)
            save(3)
        assert contents() == saved, f"the save failed at its file {fail_at} of {len(synced)}"


def test_files_written_together_are_renamed_when_the_block_ends(tmp_path, monkeypatch):
    """Inside the block the earlier files stay; a block inside another belongs to the outer one; only a
    rename that fails at the end can leave some files replaced, and then nothing is left beside them."""
    names = ["a", "b", "c"]
    for name in names:
        files.replace_text(tmp_path / name, "old")
    with files.written_together():
        with files.written_together():
            files.replace_text(tmp_path / "a", "new")
        files.replace_text(tmp_path / "b", "new")
        assert [(tmp_path / name).read_text() for name in names] == ["old", "old", "old"]
    assert [(tmp_path / name).read_text() for name in names] == ["new", "new", "old"]
    real_replace = os.replace

    def fail_at_b(source, target):
        if Path(target).name == "b":
            raise OSError(errno.EIO, "Input/output error")
        real_replace(source, target)

    monkeypatch.setattr(files.os, "replace", fail_at_b)
    with pytest.raises(OSError, match="Input/output error"), files.written_together():
        for name in names:
            files.replace_text(tmp_path / name, "newer")
    assert [(tmp_path / name).read_text() for name in names] == ["newer", "new", "old"]
    assert sorted(path.name for path in tmp_path.iterdir()) == names


def a_dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_leftovers_of_dead_writers_are_removed_and_a_live_writers_file_is_kept(tmp_path, weights):
    host = files._HOST
    dead = tmp_path / f".w.npz.{host}.{a_dead_pid()}.0123abcd.tmp"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".w.npz.{host}.{sleeper.pid}.89abcdef.tmp"
        other_host = tmp_path / f".w.npz.elsewhere.{a_dead_pid()}.01234567.tmp"
        unrelated = tmp_path / f".other.npz.{host}.{a_dead_pid()}.01234567.tmp"
        for leftover in (dead, live, other_host, unrelated):
            leftover.write_bytes(b"half a file")
        save_weights(tmp_path / "w.npz", CONFIG, weights)
        assert not dead.exists()
        assert live.exists() and other_host.exists() and unrelated.exists()  # not ours to judge
    finally:
        sleeper.kill()
        sleeper.wait()


KILLED_WRITER = """
import sys, time
import bert_multi.safe_files
import bert_multi.spec.weight_file as weights_module
bert_multi.safe_files.UNNAMED_WRITES = {unnamed}
from bert_multi import BERTConfig, init_weights, save_weights

def write_then_hang(file, arrays):
    file.write(b"PK\\x03\\x04 the first part of an archive")
    file.flush()
    print("writing", flush=True)
    time.sleep(60)

weights_module.write_archive = write_then_hang
config = BERTConfig(**{config!r})
save_weights(sys.argv[1], config, init_weights(config, seed=9))
"""


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed file", "named file"])
def test_kill_9_in_the_middle_of_a_save_loses_nothing_and_leaves_nothing(tmp_path, weights, unnamed):
    """An unnamed file (O_TMPFILE) dies with its writer; a named one is removed by the next save."""
    if unnamed and files.unnamed_file(tmp_path) is None:
        pytest.skip("this system or filesystem has no unnamed files (O_TMPFILE)")
    elif unnamed:
        os.close(files.unnamed_file(tmp_path))
    path = save_weights(tmp_path / "w.npz", CONFIG, weights)
    before = path.read_bytes()
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER.format(config=CONFIG.to_dict(), unnamed=unnamed), str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline().strip() == "writing"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert path.read_bytes() == before
    leftovers = [p for p in tmp_path.iterdir() if p.name != "w.npz"]
    if unnamed:
        assert leftovers == []
    else:
        [leftover] = leftovers
        assert leftover.stat().st_size > 0
    save_weights(path, CONFIG, init_weights(CONFIG, seed=10))
    assert [p.name for p in tmp_path.iterdir()] == ["w.npz"]
    assert np.array_equal(load_weights(path)[1]["hidden.0.weight"], init_weights(CONFIG, seed=10)["hidden.0.weight"])


def test_the_archive_is_what_np_savez_writes(tmp_path, weights):
    """The writer hands each array's bytes to the file without np.savez's copies, and must still write
    np.savez's archive: the same members at the same offsets with the same CRCs (only the time stamps
    may differ). Arrays in other layouts are written C-ordered, with the same values."""
    import io
    import zipfile

    def members(data):
        return [(i.filename, i.header_offset, i.file_size, i.CRC) for i in zipfile.ZipFile(io.BytesIO(data)).infolist()]

    ours, theirs = io.BytesIO(), io.BytesIO()
    weights_module.write_archive(ours, weights)
    np.savez(theirs, **weights)
    assert len(ours.getvalue()) == len(theirs.getvalue())
    assert members(ours.getvalue()) == members(theirs.getvalue())
    odd = {
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "big_endian": np.arange(3, dtype=">f4"),
        "strided": np.arange(12.0)[::3],
        "empty": np.zeros((0, 4)),
        "scalar": np.array(2.5),
    }
    written = io.BytesIO()
    weights_module.write_archive(written, odd)
    loaded = np.load(io.BytesIO(written.getvalue()))
    for name, array in odd.items():
        assert loaded[name].dtype == array.dtype and loaded[name].shape == array.shape
        assert np.array_equal(loaded[name], array), name
