"""Checkpoints saved by the ORIGINAL d2l 0.17.6 Paddle code, read without Paddle and without unpickling
(``conformance/original_d2l/paddle_checkpoints.py`` wrote them with PaddlePaddle 2.6; this suite only reads
them). Each holds the weights of ``weights-d2l.npz`` as Paddle stored them, whose outputs that code
recorded (``d2l-0.17.6-paddle.npz``, held to every backend by test_original_d2l.py): so a file read right
gives those weights back exactly, every nn.Linear weight turned from Paddle's (in, out)."""

import io
import pickle
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bert_multi import WeightsError, convert, inspect_checkpoint, load_backend, load_checkpoint, load_weights
from bert_multi.backend import framework_names
from bert_multi.backend.registry import not_in_process
from bert_multi.files.formats.paddle import read_pdparams, write_pickle

HERE = Path(__file__).parent / "original_d2l"
FILES = HERE / "checkpoints"
CONFIG, CANONICAL = load_weights(HERE / "weights-d2l.npz")
STORED = {name: array.astype(np.float32) for name, array in CANONICAL.items()}  # Paddle's float32 parameters
STATED = {"num_heads": CONFIG.num_heads, "d2l_version": "0.17.6"}
# d2l's BERTModel has 16 nn.Linear layers at SIZES: 6 per block, the pooler, the MLM's two, the NSP's.
LINEAR_WEIGHTS = 6 * CONFIG.num_blks + 4

# (file, format, heads, what the reader says it did beyond the transposition, statements)
FILES_SAVED = [
    ("d2l-0.17.6-paddle.pdparams", "paddle", ("pooler", "mlm", "nsp"), [], {}),
    ("protocol2.pdparams", "paddle", ("pooler", "mlm", "nsp"), [], {}),
    ("paddle3.pdparams", "paddle", ("pooler", "mlm", "nsp"), [], {}),  # NumPy 2's numpy._core recipe
    ("wrapped.pdparams", "paddle", ("pooler", "mlm", "nsp"), ["under the key 'model'"], {"key": "model"}),
    ("classifier.pdparams", "paddle", ("pooler",), [], {}),
    ("pretrained-paddle", "d2l-dir", ("pooler", "mlm", "nsp"), [], {}),
]


@pytest.mark.parametrize("name, kind, heads, notes, extra", FILES_SAVED, ids=[f[0] for f in FILES_SAVED])
def test_each_file_d2l_paddle_saved_loads_to_the_weights_it_holds(name, kind, heads, notes, extra):
    info = inspect_checkpoint(FILES / name, **extra)
    assert (info.format, info.framework, info.heads) == (kind, None, heads)
    turned = LINEAR_WEIGHTS + (1 if name == "classifier.pdparams" else 0) - (3 if heads == ("pooler",) else 0)
    assert f"transposed {turned} nn.Linear weights from Paddle's (in, out) to (out, in)" in info.notes
    assert all(any(note in said for said in info.notes) for note in notes), info.notes
    checkpoint = load_checkpoint(FILES / name, **STATED, **extra)
    assert sorted(checkpoint.weights) == sorted(framework_names(checkpoint.config, []))
    assert all(checkpoint.weights[n].tobytes() == STORED[n].tobytes() for n in checkpoint.weights)
    if name == "classifier.pdparams":  # the fine-tuning head is no part of BERT
        assert info.ignored == ["output.bias", "output.weight"]


def test_the_files_spell_numpys_recipe_as_numpy_1_and_numpy_2_do():
    """Paddle 2.6 on NumPy 1 names ``numpy.core.multiarray._reconstruct``; Paddle 3 on NumPy 2 names
    ``numpy._core``: both are read above, and neither fixture may lose its spelling unnoticed."""
    assert b"numpy.core.multiarray" in (FILES / "d2l-0.17.6-paddle.pdparams").read_bytes()
    assert b"numpy._core.multiarray" in (FILES / "paddle3.pdparams").read_bytes()


def test_a_square_weight_is_turned_because_the_file_is_paddles_not_because_of_its_shape():
    """Every attention projection is square: read as PyTorch's layout it would load, and compute another
    function. The file's own array is the transpose of the weight, and not symmetric."""
    raw, _, _ = read_pdparams(FILES / "d2l-0.17.6-paddle.pdparams")
    name = "encoder.blks.0.attention.W_q.weight"
    assert raw[name].shape[0] == raw[name].shape[1] and not np.array_equal(raw[name], raw[name].T)
    assert raw[name].T.tobytes() == STORED[name].tobytes()
    assert (
        load_checkpoint(FILES / "d2l-0.17.6-paddle.pdparams", **STATED).weights[name].tobytes()
        == STORED[name].tobytes()
    )


def test_a_pretrained_paddle_zip_reads_like_its_directory(tmp_path):
    archive = tmp_path / "bert.small.paddle.zip"  # as d2l's fine-tuning section downloads it: a folder inside
    with zipfile.ZipFile(archive, "w") as out:
        for path in (FILES / "pretrained-paddle").iterdir():
            out.write(path, f"bert.small.paddle/{path.name}")
    info = inspect_checkpoint(archive)
    assert (info.format, info.framework, len(info.vocab or [])) == ("d2l-zip", None, CONFIG.vocab_size)
    checkpoint = load_checkpoint(archive, **STATED)
    assert all(checkpoint.weights[n].tobytes() == STORED[n].tobytes() for n in STORED)


def test_bfloat16_is_read_from_the_uint16_bits_paddle_saves_and_loads_when_cast():
    with pytest.raises(WeightsError, match="is bfloat16; .*pass dtype='float32'"):
        load_checkpoint(FILES / "bfloat16.pdparams", **STATED)
    checkpoint = load_checkpoint(FILES / "bfloat16.pdparams", **STATED, dtype="float32")
    for name, array in checkpoint.weights.items():  # Paddle 2.6 (which saved it) keeps float32's top 16 bits
        kept = (STORED[name].view(np.uint32) & 0xFFFF0000).view(np.float32)
        assert array.tobytes() == kept.tobytes(), name


@pytest.mark.parametrize(
    "source, statements", [("model.params", {"d2l_version": "1.0.3"}), ("d2l-0.17.6-paddle.pdparams", {})]
)
def test_bert_multi_writes_what_paddle_saved(source, statements, tmp_path):
    """Converted from d2l 1.0.3's Gluon file of the same weights (or from Paddle's own), the .pdparams has
    the names, order, shapes, dtypes and bytes of the file Paddle saved; Python's own unpickler (which
    ``paddle.load`` runs) reads it as the same arrays. (paddle_checkpoints.py --check loads the conversions
    in d2l's Paddle BERTModel itself.)"""
    convert(
        FILES / source,
        tmp_path / "out.pdparams",
        num_heads=CONFIG.num_heads,
        **({"d2l_version": "0.17.6"} | statements),
    )
    original, _, _ = read_pdparams(FILES / "d2l-0.17.6-paddle.pdparams")
    written, _, _ = read_pdparams(tmp_path / "out.pdparams")
    assert [(n, a.shape, a.dtype) for n, a in written.items()] == [(n, a.shape, a.dtype) for n, a in original.items()]
    assert all(written[n].tobytes() == original[n].tobytes() for n in original)
    unpickled = pickle.loads((tmp_path / "out.pdparams").read_bytes())  # our own file, in a test: never on a load path
    assert list(unpickled) == list(original)
    assert all(unpickled[n].tobytes() == original[n].tobytes() for n in original)


ARRAYS = st.builds(
    lambda dtype, shape, order, seed: np.asarray(
        np.random.default_rng(seed).integers(-100, 100, size=shape).astype(dtype), order=order
    ),
    st.sampled_from(["<f4", ">f4", "<f8", "<f2", "<i8", "|b1", "|i1"]),
    st.lists(st.integers(0, 4), max_size=3).map(tuple),
    st.sampled_from(["C", "F"]),
    st.integers(0, 2**16),
)


@settings(max_examples=60, deadline=None)
@given(
    arrays=st.dictionaries(st.text("abc.", min_size=1, max_size=6), ARRAYS, min_size=1, max_size=4),
    protocol=st.integers(2, 4),
)
def test_any_dict_of_arrays_numpy_pickles_reads_back_exactly(arrays, protocol):
    """Python's own pickler with this environment's NumPy (``numpy.core`` in NumPy 1, ``numpy._core`` in
    NumPy 2): every protocol paddle.save may use, byte orders, Fortran order, empty and 0-d arrays."""
    data = pickle.dumps(arrays, protocol=protocol)
    read = _read_bytes(data)
    assert list(read) == list(arrays)
    for name, array in arrays.items():
        assert read[name].shape == array.shape and read[name].dtype == array.dtype.newbyteorder("=")
        assert np.array_equal(read[name], array)
    written = io.BytesIO()
    write_pickle(written, arrays)
    again = _read_bytes(written.getvalue())
    assert all(again[n].tobytes() == read[n].tobytes() for n in arrays)


def test_an_array_saved_under_two_names_is_read_once():
    shared = np.arange(6, dtype=np.float32).reshape(2, 3)
    read = _read_bytes(pickle.dumps({"a": shared, "b": shared}, protocol=4))  # the second is a memo reference
    assert read["a"] is read["b"] and read["a"].tobytes() == shared.tobytes()


def test_nothing_a_file_names_is_called(tmp_path):
    marker = tmp_path / "ran"
    payload = f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()  # os.system("touch ...") when unpickled
    for name, data in {
        "os.system at the top": payload,
        "inside a state_dict": b"\x80\x02}X\x01\x00\x00\x00w" + payload[:-1] + b"s.",
    }.items():
        path = tmp_path / "evil.pdparams"
        path.write_bytes(data)
        with pytest.raises(WeightsError, match=r"a pickled os\.system|not a state_dict"):
            load_checkpoint(path, **STATED)
        assert not marker.exists(), name


def test_a_pickle_of_another_protocol_or_shape_says_what_is_read(tmp_path):
    (tmp_path / "five.pkl").write_bytes(pickle.dumps({"w": np.zeros(2)}, protocol=5))
    (tmp_path / "list.pkl").write_bytes(pickle.dumps([np.zeros(2)], protocol=4))
    with pytest.raises(WeightsError, match="of protocol 5: bert_multi reads torch.save's pickles.*paddle.save's"):
        inspect_checkpoint(tmp_path / "five.pkl")
    with pytest.raises(WeightsError, match="it holds a list; paddle.save"):
        inspect_checkpoint(tmp_path / "list.pkl")


def _read_bytes(data: bytes) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".pdparams") as file:
        file.write(data)
        file.flush()
        return read_pdparams(file.name)[0]


@pytest.mark.parametrize("reader", ["torch", "mxnet"])
@pytest.mark.parametrize("name", ["d2l-0.17.6-paddle.pdparams", "pretrained-paddle"])
def test_a_frameworks_own_reader_refuses_paddles_file_naming_the_reader_that_reads_it(reader, name):
    if not_in_process(reader):
        pytest.skip(not_in_process(reader))
    with pytest.raises(WeightsError) as raised:
        load_backend(reader).load_checkpoint(FILES / name, **STATED)
    message = str(raised.value)
    assert "Paddle" in message or "d2l pretrained-model directory" in message
    assert "read it with bert_multi.load_checkpoint (any format)" in message and "load_weights" not in message


def test_a_d2l_paddle_directory_is_written_as_bert_small_paddle_holds_it(tmp_path):
    """convert --framework paddle: pretrained.pdparams (the file Paddle saved, byte for byte in its arrays)
    and vocab.json, which d2l's Paddle load_pretrained_model reads (paddle_checkpoints.py --check loads it)."""
    vocab = [f"t{i}" for i in range(CONFIG.vocab_size)]
    convert(FILES / "model.params", tmp_path / "bert.small.paddle", framework="paddle", vocab=vocab, num_heads=2,
            d2l_version="1.0.3")  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "bert.small.paddle").iterdir()) == ["pretrained.pdparams", "vocab.json"]
    written, _, _ = read_pdparams(tmp_path / "bert.small.paddle" / "pretrained.pdparams")
    original, _, _ = read_pdparams(FILES / "pretrained-paddle" / "pretrained.pdparams")
    assert list(written) == list(original) and all(written[n].tobytes() == original[n].tobytes() for n in original)
    checkpoint = load_checkpoint(tmp_path / "bert.small.paddle", **STATED)
    assert checkpoint.vocab == vocab and checkpoint.info.format == "d2l-dir"
