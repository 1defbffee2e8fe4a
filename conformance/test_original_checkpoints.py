"""Checkpoints saved by the ORIGINAL d2l 1.0.3 code the way its users save them, mistakes included
(``conformance/original_d2l/checkpoints.py`` wrote them; this suite only reads them).

Each holds the weights of ``weights-d2l.npz`` as the release stored them, whose outputs the release
itself recorded (``d2l-1.0.3-*.npz``): so a file read right gives those numbers back exactly, and a
file read wrong says what to do.
"""

import dataclasses
import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import bert_multi
from bert_multi import WeightsError, backends, convert, inspect_checkpoint, load_checkpoint, load_weights
from bert_multi.backend.registry import not_in_process
from bert_multi.engine.compare import compare_arrays, tolerance_for
from bert_multi.errors import StatementsMissing
from bert_multi.files.formats.gluon import read_params

HERE = Path(__file__).parent / "original_d2l"
FILES = HERE / "checkpoints"
CONFIG, CANONICAL = load_weights(HERE / "weights-d2l.npz")
# The release loaded the float64 canonical weights into float32 parameters.
STORED = {name: array.astype(np.float32) for name, array in CANONICAL.items()}
AVAILABLE = {name for name, status in backends().items() if status.available}
STATED = {"num_heads": CONFIG.num_heads, "d2l_version": "1.0.3"}


def needs(*frameworks):
    missing = [name for name in frameworks if name not in AVAILABLE]
    return pytest.mark.skipif(bool(missing), reason=f"needs the {', '.join(missing)} backend")


def framework_of(name: str) -> str:
    return "torch" if name.endswith(".pt") or name.endswith("torch") else "mxnet"


def recorded_encoding(framework: str) -> tuple[dict, np.ndarray]:
    with np.load(HERE / f"d2l-1.0.3-{framework}.npz", allow_pickle=False) as archive:
        inputs = {k: archive.get(f"mixed_valid_lens/inputs/{k}") for k in ("tokens", "segments", "valid_lens")}
        return inputs, archive["mixed_valid_lens/float32/encoded"]


# (file, format, heads, what the loader says it did, extra statements)
HAPPY = [
    ("state_dict.pt", "torch", ("pooler", "mlm", "nsp"), [], {}),
    ("dataparallel.pt", "torch", ("pooler", "mlm", "nsp"), ["stripped the prefix 'module.'"], {}),
    ("compiled.pt", "torch", ("pooler", "mlm", "nsp"), ["stripped the prefix '_orig_mod.'"], {}),
    ("wrapped.pt", "torch", ("pooler", "mlm", "nsp"), ["under the key 'model'"], {"key": "model"}),
    ("classifier.pt", "torch", ("pooler",), [], {}),
    ("pretrained-torch", "d2l-dir", ("pooler", "mlm", "nsp"), [], {}),
    ("model.params", "gluon", ("pooler", "mlm", "nsp"), [], {}),
    ("classifier.params", "gluon", ("pooler",), [], {}),
    ("pretrained-mxnet", "d2l-dir", ("pooler", "mlm", "nsp"), [], {}),
]


@pytest.mark.parametrize("name, kind, heads, notes, extra", HAPPY, ids=[h[0] for h in HAPPY])
def test_inspect_says_what_each_original_file_is(name, kind, heads, notes, extra):
    if framework_of(name) == "torch" and "torch" not in AVAILABLE:
        pytest.skip("needs the torch backend")
    info = inspect_checkpoint(FILES / name, key=extra.get("key"))
    assert (info.format, info.framework) == (kind, framework_of(name))
    assert info.heads == heads
    assert info.sizes == {
        k: getattr(CONFIG, k) for k in ("vocab_size", "num_hiddens", "ffn_num_hiddens", "num_blks", "max_len")
    }
    assert info.presets == ("d2l", "d2l-0.12")  # same names and shapes: only the user can tell them apart
    assert set(info.unknowns) == {"num_heads", "the generation"}
    assert info.ignored == (["output.bias", "output.weight"] if heads == ("pooler",) else [])
    assert all(any(note in said for said in info.notes) for note in notes), info.notes
    assert (info.vocab is not None) == (kind == "d2l-dir")
    described = info.describe()
    assert "cannot tell num_heads" in described and "encoder.token_embedding" in described


@pytest.mark.parametrize("name, kind, heads, notes, extra", HAPPY, ids=[h[0] for h in HAPPY])
def test_each_original_file_loads_to_the_numbers_it_holds_and_computes_what_d2l_computed(
    name, kind, heads, notes, extra
):
    if framework_of(name) == "torch" and "torch" not in AVAILABLE:
        pytest.skip("needs the torch backend")
    checkpoint = load_checkpoint(FILES / name, **STATED, **extra)
    assert checkpoint.config.heads == heads and checkpoint.config.semantics.name == "d2l"
    assert list(checkpoint.weights) == list(bert_multi.param_shapes(checkpoint.config))
    for tensor, array in checkpoint.weights.items():
        assert array.tobytes() == STORED[tensor].tobytes(), tensor
    oracle = bert_multi.load_backend("numpy").build(checkpoint.config, checkpoint.weights)
    for recorded_by in ("torch", "mxnet"):  # both frameworks' d2l 1.0.3 recorded these outputs
        inputs, expected = recorded_encoding(recorded_by)
        got = oracle(**inputs).encoded
        comparison = compare_arrays("encoded", got, expected, tolerance_for("float32", "cpu"))
        assert comparison.passed, comparison.describe()


@needs("torch")
def test_a_state_dict_saved_as_safetensors_reads_as_the_same_weights(tmp_path):
    """A d2l user's ``safetensors.torch.save_file(net.state_dict(), ...)``: PyTorch's names and layouts in a
    file of no framework's, read as the canonical ones; PyTorch's own reader names the one that reads it."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    import torch

    import bert_multi.torch

    safetensors_torch.save_file(
        torch.load(FILES / "state_dict.pt", weights_only=True), str(tmp_path / "bert.safetensors")
    )
    checkpoint = load_checkpoint(tmp_path / "bert.safetensors", **STATED)
    assert (checkpoint.info.format, checkpoint.info.framework) == ("safetensors", None)
    assert all(array.tobytes() == STORED[tensor].tobytes() for tensor, array in checkpoint.weights.items())
    assert len(checkpoint.weights) == len(STORED)
    with pytest.raises(WeightsError, match="this is a safetensors file .*, not a PyTorch checkpoint: read it with"):
        bert_multi.torch.load_checkpoint(tmp_path / "bert.safetensors", **STATED)


@needs("torch")
@pytest.mark.parametrize("savez", ["savez", "savez_compressed"])
def test_a_state_dict_saved_by_numpy_reads_as_the_same_weights(tmp_path, savez):
    """A d2l user's ``np.savez(path, **{k: v.numpy() for k, v in net.state_dict().items()})``, no manifest: read
    by its names, as the state_dict is."""
    import torch

    state = torch.load(FILES / "state_dict.pt", weights_only=True)
    getattr(np, savez)(tmp_path / "bert.npz", **{name: tensor.numpy() for name, tensor in state.items()})
    checkpoint = load_checkpoint(tmp_path / "bert.npz", **STATED)
    assert (checkpoint.info.format, checkpoint.info.framework) == ("npz-arrays", None)
    assert all(array.tobytes() == STORED[tensor].tobytes() for tensor, array in checkpoint.weights.items())
    assert len(checkpoint.weights) == len(STORED)


def test_gluons_parameters_saved_by_numpy_read_as_the_same_weights(tmp_path):
    """``np.savez(path, **{k: v.data().asnumpy() for k, v in net.collect_params().items()})`` of d2l's MXNet
    BERT: Gluon's names (a LayerNorm's gamma and beta, the pooler's hidden.weight), read as its file is."""
    from bert_multi.files.formats.gluon import read_params

    np.savez(tmp_path / "bert.npz", **read_params(FILES / "model.params"))
    checkpoint = load_checkpoint(tmp_path / "bert.npz", **STATED)
    assert (checkpoint.info.format, checkpoint.info.framework) == ("npz-arrays", "mxnet")
    assert all(array.tobytes() == STORED[tensor].tobytes() for tensor, array in checkpoint.weights.items())
    assert len(checkpoint.weights) == len(STORED)


sys.path.insert(0, str(HERE))
from generate import RELEASES  # noqa: E402

RUNS = [(release, framework, preset) for release, framework, preset, _ in RELEASES]
SUFFIXES = {"torch": ".pt", "mxnet": ".params", "paddle": ".pdparams"}
BACKEND_OF = {"torch": "torch", "mxnet": "mxnet", "paddle": None}


@pytest.mark.parametrize("release, framework, preset", RUNS, ids=[f"d2l-{r}-{f}" for r, f, _ in RUNS])
def test_every_releases_own_checkpoint_inspects_loads_computes_and_converts(release, framework, preset, tmp_path):
    """Each release of generate.py's list saved its model in its own format; read with the release
    stated, it gives back the weights and the outputs that release recorded, in either framework."""
    if framework == "torch" and "torch" not in AVAILABLE:
        pytest.skip("needs the torch backend to read a PyTorch file")
    path = FILES / f"d2l-{release}-{framework}{SUFFIXES[framework]}"
    info = inspect_checkpoint(path)
    # Paddle's file is read without Paddle, which is no backend of bert_multi's
    assert (info.framework, info.heads) == (BACKEND_OF[framework], ("pooler", "mlm", "nsp"))
    assert info.presets == (("d2l-0.11",) if preset == "d2l-0.11" else ("d2l", "d2l-0.12"))
    config, canonical = load_weights(HERE / f"weights-{preset}.npz")
    checkpoint = load_checkpoint(path, num_heads=config.num_heads, d2l_version=release)
    # dropout is no weight, and d2l 0.11's computed table stores no max_len: the release's default is read
    stored_as = {"dropout": 0.0, "max_len": 1000 if preset == "d2l-0.11" else config.max_len}
    assert checkpoint.config == dataclasses.replace(config, **stored_as)
    assert all(checkpoint.weights[n].tobytes() == canonical[n].astype(np.float32).tobytes() for n in canonical)
    with np.load(HERE / f"d2l-{release}-{framework}.npz", allow_pickle=False) as recorded:
        oracle = bert_multi.load_backend("numpy").build(
            checkpoint.config, checkpoint.weights, layer_norm_eps=float(recorded["layer_norm_eps"])
        )
        cases = sorted({key.split("/")[0] for key in recorded.files if "/float32/" in key})
        for case in cases:
            inputs = {
                k: recorded.get(f"{case}/inputs/{k}") for k in ("tokens", "segments", "valid_lens", "pred_positions")
            }
            out = oracle(**inputs)
            for output in ("encoded", "mlm", "nsp"):
                if f"{case}/float32/{output}" in recorded.files:
                    comparison = compare_arrays(
                        output,
                        getattr(out, output),
                        recorded[f"{case}/float32/{output}"],
                        tolerance_for("float32", "cpu"),
                    )
                    assert comparison.passed, f"{case}: {comparison.describe()}"
    other = {"torch": "mxnet", "mxnet": "torch", "paddle": "torch"}[framework]
    if other in AVAILABLE:
        target = tmp_path / ("other.pt" if other == "torch" else "other.params")
        convert(path, target, num_heads=config.num_heads, d2l_version=release)
        again = load_checkpoint(target, num_heads=config.num_heads, d2l_version=release)
        assert again.config == checkpoint.config
        assert all(again.weights[n].tobytes() == checkpoint.weights[n].tobytes() for n in canonical)


def test_a_d2l_pretrained_model_zip_reads_like_its_directory(tmp_path):
    archive = tmp_path / "bert.tiny.zip"  # as d2l's DATA_HUB serves bert.small.zip: a folder inside
    with zipfile.ZipFile(archive, "w") as out:
        for path in (FILES / "pretrained-mxnet").iterdir():
            out.write(path, f"bert.tiny/{path.name}")
    info = inspect_checkpoint(archive)
    assert (info.format, info.framework, info.vocab) == (
        "d2l-zip",
        "mxnet",
        json.loads((FILES / "pretrained-mxnet" / "vocab.json").read_text()),
    )
    checkpoint = load_checkpoint(archive, **STATED)
    assert all(checkpoint.weights[n].tobytes() == STORED[n].tobytes() for n in STORED)


# (file, reader, statements, what the message must say)
MISTAKES = [
    ("lazy.pt", "any", STATED, ["saved before the model's first forward pass", "Run one forward pass"]),
    ("module.pt", "any", STATED, ["a pickled object (d2l.torch.BERTModel)", "save net.state_dict() instead"]),
    ("wrapped.pt", "any", STATED, ["keys ['model', 'epoch']", "pass key='model' (--key model)"]),
    ("half.pt", "any", STATED, ["is float16", "pass dtype='float32' (--cast float32)"]),
    ("bfloat16.pt", "any", STATED, ["is bfloat16", "pass dtype='float32' (--cast float32)"]),
    # everything missing in one message, in Python's spelling (the command line's: tests/test_checkpoints.py)
    ("state_dict.pt", "any", {}, ["state num_heads= and preset= or d2l_version= to read it", "any of [1, 2, 4, 8]"]),
    ("state_dict.pt", "any", {"num_heads": 2}, ["state preset= or d2l_version= to read it", "tiled in 0.12-0.15"]),
    (
        "state_dict.pt",
        "any",
        {"num_heads": 2, "preset": "d2l-0.11"},
        ["'d2l-0.11' does not fit", "d2l (d2l 0.16 - 1.0)"],
    ),
    ("state_dict.pt", "mxnet", STATED, ["PyTorch state_dict file", "read it with bert_multi.torch.load_checkpoint"]),
    ("model.params", "torch", STATED, ["Gluon parameter file", "read it with bert_multi.mxnet.load_checkpoint"]),
    ("pretrained-mxnet", "torch", STATED, ["written by MXNet/Gluon", "bert-multi convert"]),
]


@pytest.mark.parametrize(
    "name, reader, statements, expected", MISTAKES, ids=[f"{m[0]}-{m[1]}-{len(m[2])}" for m in MISTAKES]
)
def test_each_mistake_says_what_to_do(name, reader, statements, expected):
    if name.endswith(".pt") and reader != "mxnet" and "torch" not in AVAILABLE:
        pytest.skip("needs the torch backend")
    if reader != "any" and not_in_process(reader):  # its own load_checkpoint, in this process
        pytest.skip(not_in_process(reader))
    load = load_checkpoint if reader == "any" else bert_multi.load_backend(reader).load_checkpoint
    with pytest.raises(WeightsError) as raised:
        load(FILES / name, **statements)
    message = str(raised.value)
    assert message.startswith(str(FILES / name)) and "\n" not in message
    assert all(part in message for part in expected), message
    if isinstance(raised.value, StatementsMissing):
        assert "--" not in message  # a Python caller is told arguments, not flags


@needs("torch")
def test_half_precision_loads_when_cast_explicitly():
    for name, rounded in (("half.pt", np.float16), ("bfloat16.pt", None)):
        checkpoint = load_checkpoint(FILES / name, **STATED, dtype="float32")
        for tensor, array in checkpoint.weights.items():
            assert array.dtype == np.float32
            if rounded is not None:
                assert array.tobytes() == STORED[tensor].astype(rounded).astype(np.float32).tobytes()
            else:  # bfloat16 keeps float32's exponent and the top 7 bits of its fraction
                assert np.abs(array - STORED[tensor]).max() <= np.abs(STORED[tensor]).max() * 2**-8


@needs("torch")
def test_no_load_path_unpickles_code(tmp_path):
    marker = tmp_path / "ran"
    payload = f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()  # os.system("touch ...") when unpickled
    with zipfile.ZipFile(tmp_path / "evil.pt", "w") as out:
        out.writestr("evil/data.pkl", payload)
        out.writestr("evil/version", "3\n")
    with pytest.raises(WeightsError, match="pickled object \\(os.system\\)|posix.system"):
        load_checkpoint(tmp_path / "evil.pt", **STATED)
    assert not marker.exists()


@needs("torch", "mxnet")
@pytest.mark.parametrize("source", ["state_dict.pt", "model.params"])
def test_converted_files_are_what_the_original_code_saved(source, tmp_path):
    """Names, order, shapes and dtypes of each converted file equal those of the file the original code
    saved in that format; the checker script loads them in d2l 1.0.3 itself (see its docstring)."""
    torch_backend = bert_multi.load_backend("torch")
    convert(FILES / source, tmp_path / "out.pt", **STATED)
    convert(FILES / source, tmp_path / "out.params", **STATED)
    convert(
        FILES / source, tmp_path / "dir", framework="torch", vocab=[str(i) for i in range(CONFIG.vocab_size)], **STATED
    )

    def described(arrays):
        return [(name, array.shape, array.dtype.name) for name, array in arrays.items()]

    original_torch = torch_backend.read_checkpoint(FILES / "state_dict.pt")[0]
    assert described(torch_backend.read_checkpoint(tmp_path / "out.pt")[0]) == described(original_torch)
    assert described(torch_backend.read_checkpoint(tmp_path / "dir" / "pretrained.params")[0]) == described(
        original_torch
    )
    original_gluon = read_params(FILES / "model.params")
    assert sorted(described(read_params(tmp_path / "out.params"))) == sorted(described(original_gluon))
    for name, array in read_params(tmp_path / "out.params").items():
        assert array.tobytes() == original_gluon[name].tobytes(), name
    for name, array in torch_backend.read_checkpoint(tmp_path / "out.pt")[0].items():
        assert array.tobytes() == original_torch[name].tobytes(), name


def test_a_directory_needs_a_framework_and_a_vocab(tmp_path):
    with pytest.raises(ValueError, match="say which with framework="):
        convert(FILES / "model.params", tmp_path / "dir", **STATED)
    with pytest.raises(ValueError, match="needs a vocab.json"):
        convert(FILES / "model.params", tmp_path / "dir", framework="mxnet", **STATED)
    assert not (tmp_path / "dir").exists()
