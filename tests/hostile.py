"""Hostile files for the readers: known reproducers, a byte-level and structure-aware fuzzer, and a
child process that loads files under a memory cap and reports how each load ended.

The readers promise that a malformed file is a clean error (``WeightsError``, or ``InputError`` for an
inputs file) in time and memory bounded by the file's real size: never another exception, a crash, a
hang or an allocation a header asked for. A regression could break any of those, so files are loaded
in a child process (``python tests/hostile.py probe ...``) with an address-space limit, and the tests
time it out. ``python tests/hostile.py fuzz --seconds N`` (``make fuzz``) fuzzes for longer.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import random
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np

from bert_multi import BERTConfig, InputError, UsageError, WeightsError, random_weights, save_weights
from bert_multi.backend.channel import DamagedFile
from bert_multi.cache import EntryRefused
from bert_multi.safe_files import MXNET_LIST_MAGIC

HERE = Path(__file__).resolve()
TF_CHECKPOINT = HERE.parent.parent / "conformance" / "original_bert" / "checkpoints" / "pretrained"
HF_FLAX = TF_CHECKPOINT.parent / "flax-model"  # transformers' FlaxBertModel, saved by transformers 4.57
HF_TF = TF_CHECKPOINT.parent / "tf-classifier"  # its TFBertForSequenceClassification, saved by Keras 2 (HDF5)
TF2_SAVED = TF_CHECKPOINT.parent / "tf2-savedmodel"  # a Model Garden BertEncoder's SavedModel variables (TF 2.20)
KERAS_HUB = TF_CHECKPOINT.parent / "keras-hub-backbone"  # a BertBackbone preset, saved by KerasHub 0.32 (Keras 3)
PADDLENLP = TF_CHECKPOINT.parent / "paddlenlp-pretraining"  # a BertForPretraining, saved by PaddleNLP 2.8
PADDLENLP2 = TF_CHECKPOINT.parent / "paddlenlp2-pretraining"  # the same, saved by PaddleNLP 2.3: model_config.json
PADDLENLP3 = TF_CHECKPOINT.parent / "paddlenlp3-bfloat16"  # the same, cast to bfloat16 by PaddleNLP 3: safetensors
FLAX_STATE = TF_CHECKPOINT.parent / "flax-train-state" / "checkpoint_2"  # a TrainState, by flax.training (0.12)
ORBAX = TF_CHECKPOINT.parent / "orbax-train-state" / "checkpoint_2"  # the same TrainState, by Orbax 0.12
DEEPSPEED = TF_CHECKPOINT.parent / "deepspeed-zero2"  # DeepSpeed 0.19's save_checkpoint, ZeRO stage 2
EXPORTED = TF_CHECKPOINT.parent / "exported.pt2"  # transformers' BertForPreTraining by torch.export.save (2.13)
CONFIG = BERTConfig(vocab_size=11, num_hiddens=4, ffn_num_hiddens=6, num_heads=2, num_blks=1, max_len=5)
MEMORY_CAP_BYTES = 4 << 30  # torch and MXNet reserve about 1.2 GB of address space when imported
GIB3 = 3 << 30


# --- Loaders, by name: what the child process runs on each file -----------------------------------------


def _load_weights(path: str) -> object:
    from bert_multi import load_weights

    return load_weights(path)


def _read_params(path: str) -> object:
    from bert_multi.files.formats.gluon import read_params

    return read_params(path)


def _read_flax(path: str) -> object:
    from bert_multi.files.formats.flax import read_checkpoint

    return read_checkpoint(path)


def _read_pdparams(path: str) -> object:
    from bert_multi.files.formats.paddle import read_pdparams

    return read_pdparams(path)


def _torch_checkpoint(path: str) -> object:
    import bert_multi.torch

    return bert_multi.torch.load_checkpoint(path, CONFIG)


def _mxnet_checkpoint(path: str) -> object:
    import bert_multi.mxnet

    return bert_multi.mxnet.load_checkpoint(path, CONFIG)


def _inputs(path: str) -> object:
    from bert_multi.cli.common import read_inputs

    return read_inputs(path)


def _map_file(path: str) -> object:
    """A map file, read and expanded over CONFIG's canonical names, as verify uses one."""
    from bert_multi.spec.schema import param_shapes
    from bert_multi.verify.map_file import read_map

    return read_map(path).expand(param_shapes(CONFIG))


def _checkpoint(path: str) -> object:
    """A checkpoint of any format, as inspect and convert read one: what its tensors imply, then loaded
    with what it cannot tell stated."""
    from bert_multi import inspect_checkpoint, load_checkpoint

    inspect_checkpoint(path)
    return load_checkpoint(path, num_heads=CONFIG.num_heads, preset="d2l")


def _named_arrays(path: str) -> object:
    """A file as an .npz of named arrays without a manifest (np.savez of a state_dict), by its suffix."""
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "weights.npz").symlink_to(Path(path).absolute())
        return _checkpoint(str(Path(directory) / "weights.npz"))


def named_arrays_bytes(compressed: bool = False) -> bytes:
    """np.savez (or savez_compressed) of CONFIG's weights under their names, as a user carries them."""
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **random_weights(CONFIG, seed=0, dtype="float32"))
    return buffer.getvalue()


def _worker_reply(path: str) -> object:
    """An array file as a worker of another environment's reply, as its caller reads it."""
    from bert_multi.backend.channel import read_arrays

    return read_arrays(path)


def _cache_entry(path: str) -> object:
    """A file as the compilation cache reads the entry of ``CACHE_KEY``."""
    from bert_multi.cache import read_entry

    return read_entry(path, CACHE_KEY)


def _tf_checkpoint(path: str) -> object:
    """A file as the index of Google's TensorFlow checkpoint, beside the fixture's data and config."""
    from bert_multi import load_checkpoint
    from bert_multi.files.formats.tensorflow import read_index

    if not os.path.isfile(path):  # a FIFO, a directory: what the index's reader says of it, without a copy
        return read_index(Path(path))
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = Path(directory) / "pretrained"
        shutil.copytree(TF_CHECKPOINT, checkpoint)
        shutil.copyfile(path, checkpoint / "bert_model.ckpt.index")
        return load_checkpoint(checkpoint)


def _safetensors(path: str) -> object:
    from bert_multi.files.formats.safetensors import read_safetensors

    return read_safetensors(path)


def _safetensors_file(path: str) -> object:
    """A safetensors file alone (named so), as a checkpoint: a transformers BERT's tensors or a d2l one's."""
    from bert_multi import load_checkpoint

    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "bert.safetensors").symlink_to(Path(path).absolute())
        return load_checkpoint(Path(directory) / "bert.safetensors", num_heads=2, preset="d2l")


def _keras_weights(path: str) -> object:
    """A Keras .h5 alone (named so), as a checkpoint: what a transformers 4 TensorFlow BERT's save_weights writes."""
    from bert_multi import load_checkpoint

    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "bert.h5").symlink_to(Path(path).absolute())
        return load_checkpoint(Path(directory) / "bert.h5", num_heads=2, dtype="float32")


def _exported_program(path: str) -> object:
    from bert_multi import load_checkpoint

    return load_checkpoint(path, num_heads=2)


def _huggingface_config(path: str) -> object:
    """A HuggingFace directory whose config.json is (a link to) the file at ``path``, beside valid weights."""
    from bert_multi.files.formats.huggingface import read_directory

    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "config.json").symlink_to(Path(path).absolute())
        (Path(directory) / "model.safetensors").write_bytes(huggingface_files()["model.safetensors"])
        return read_directory(directory)


def _fixture_with(fixture: Path, member: str, **options: object) -> Callable[[str], object]:
    """A loader: the checkpoint directory ``fixture``, its files linked, but its ``member`` (a path within it) a
    link to the file at the loader's path; loaded as a checkpoint with ``options``."""

    def load(path: str) -> object:
        from bert_multi import load_checkpoint

        with tempfile.TemporaryDirectory() as directory:
            copy = Path(directory) / fixture.name
            for source in sorted(found for found in fixture.rglob("*") if found.is_file()):
                target = copy / source.relative_to(fixture)
                target.parent.mkdir(parents=True, exist_ok=True)
                linked = Path(path) if source == fixture / member else source
                target.symlink_to(linked.absolute())
            return load_checkpoint(copy, **options)

    return load


def _with_nothing_stated(path: str) -> object:
    """A checkpoint that records all it needs (a .keras file, a zipped directory), loaded with nothing stated."""
    from bert_multi import load_checkpoint

    return load_checkpoint(path)


def _shard_index(path: str) -> object:
    """A HuggingFace directory saved in two shards whose index is (a link to) the file at ``path``."""
    from bert_multi import load_checkpoint

    with tempfile.TemporaryDirectory() as directory:
        for name, data in sharded_files().items():
            if name != SHARD_INDEX:
                (Path(directory) / name).write_bytes(data)
        (Path(directory) / SHARD_INDEX).symlink_to(Path(path).absolute())
        return load_checkpoint(directory)


def _training_state(path: str) -> object:
    """A checkpoint directory whose state.npz is (a link to) the file at ``path``."""
    from bert_multi.training import load_training_state

    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "state.npz").symlink_to(Path(path).absolute())
        return load_training_state(directory)


_D2L_FILES: dict[str, bytes] = {}


def d2l_params_bytes() -> bytes:
    """A d2l directory's pretrained.params (Gluon's), made once per process."""
    if "pretrained.params" not in _D2L_FILES:
        _D2L_FILES["pretrained.params"] = params_bytes(gluon_weights())
    return _D2L_FILES["pretrained.params"]


def _d2l_vocab(path: str) -> object:
    """A d2l pretrained-model directory (a Gluon pretrained.params) whose vocab.json is (a link to) ``path``."""
    from bert_multi import load_checkpoint

    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "pretrained.params").write_bytes(d2l_params_bytes())
        (Path(directory) / "vocab.json").symlink_to(Path(path).absolute())
        return load_checkpoint(directory, num_heads=2, preset="d2l")


def _d2l_zip(path: str) -> object:
    from bert_multi import load_checkpoint

    return load_checkpoint(path, num_heads=2, preset="d2l")


def d2l_zip_bytes() -> bytes:
    """A d2l pretrained-model zip, as d2l's downloads are: bert.small/pretrained.params and vocab.json."""
    return make_zip([("bert.small/pretrained.params", d2l_params_bytes()),
                     ("bert.small/vocab.json", vocab_bytes())])  # fmt: skip


def _corpus(path: str) -> object:
    from bert_multi.cli.pretrain import _read_corpus
    from bert_multi.training import PretrainingData, paragraphs_from_lines

    return PretrainingData.from_paragraphs(paragraphs_from_lines(_read_corpus(path)), max_len=64)


LOADERS: dict[str, Callable[[str], object]] = {
    "map": _map_file,
    "vocab": _d2l_vocab,
    "d2lzip": _d2l_zip,
    "corpus": _corpus,
    "state": _training_state,
    "safetensors": _safetensors,
    "safetensorsfile": _safetensors_file,
    "hfconfig": _huggingface_config,
    "hfflax": _fixture_with(HF_FLAX, "flax_model.msgpack", dtype="float32"),  # cast where it is bfloat16
    "hfh5": _fixture_with(HF_TF, "tf_model.h5", dtype="float32"),
    "h5alone": _keras_weights,
    "hfindex": _shard_index,
    "kerashub": _fixture_with(KERAS_HUB, "model.weights.h5"),
    "kerasfile": _with_nothing_stated,
    "kerasconfig": _fixture_with(KERAS_HUB, "config.json"),
    "paddlenlp": _fixture_with(PADDLENLP, "model_state.pdparams"),
    "paddlenlp3": _fixture_with(PADDLENLP3, "model.safetensors", dtype="float32"),
    "paddlenlp2config": _fixture_with(PADDLENLP2, "model_config.json"),
    "tf2index": _fixture_with(TF2_SAVED, "variables/variables.index"),
    "tf2data": _fixture_with(TF2_SAVED, "variables/variables.data-00000-of-00001"),
    "tfindex": _tf_checkpoint,
    "orbax": _fixture_with(ORBAX, "_METADATA"),  # never read: named, with what its metadata lists
    "deepspeed": _fixture_with(DEEPSPEED, "latest", num_heads=2),  # the tag of the save to read
    "pt2": _exported_program,
    "zippeddir": _with_nothing_stated,  # a zip read as a checkpoint with nothing stated: Google's BERT zipped, say
    "weights": _load_weights,
    "npzarrays": _named_arrays,
    "params": _read_params,
    "flax": _read_flax,
    "paddle": _read_pdparams,
    "torch": _torch_checkpoint,
    "mxnet": _mxnet_checkpoint,
    "checkpoint": _checkpoint,
    "reply": _worker_reply,
    "inputs": _inputs,
    "cache": _cache_entry,
}
# The error each reader promises for a malformed file (the inputs reader: InputError, the default).
WEIGHT_READERS = (
    *(
        "map",
        "vocab",
        "d2lzip",
        "state",
        "safetensors",
        "safetensorsfile",
        "hfconfig",
        "hfflax",
        "hfh5",
        "h5alone",
        "tfindex",
        "orbax",
        "deepspeed",
        "pt2",
        "zippeddir",
        "weights",
        "npzarrays",
    ),
    *(
        "hfindex",
        "kerashub",
        "kerasfile",
        "kerasconfig",
        "tf2index",
        "tf2data",
        "params",
        "flax",
        "paddle",
        "paddlenlp",
        "paddlenlp3",
        "paddlenlp2config",
    ),
    *("torch", "mxnet"),
)
CLEAN_ERRORS: dict[str, type[Exception] | tuple[type[Exception], ...]] = {
    **{name: WeightsError for name in WEIGHT_READERS},
    "map": (WeightsError, UsageError),  # a rule that names no tensor of the config is a usage error
    "checkpoint": WeightsError,
    "reply": DamagedFile,
    "cache": EntryRefused,
}


def probe(loader: str, path: str) -> dict[str, str]:
    """Load one file; say whether it loaded, was refused with the promised error, or escaped."""
    clean = CLEAN_ERRORS.get(loader, InputError)
    try:
        LOADERS[loader](path)
        return {"outcome": "loaded"}
    except clean as error:
        return {"outcome": "refused", "message": str(error)}
    except BaseException as error:  # noqa: BLE001 - anything else is what we are looking for
        return {
            "outcome": "escaped",
            "type": type(error).__name__,
            "message": str(error)[:500],
            "traceback": traceback.format_exc()[-2000:],
        }


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))


def run_child(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run this file in a child process (which caps its own memory); a hang is a ``TimeoutExpired``."""
    return subprocess.run([sys.executable, str(HERE), *args], capture_output=True, text=True, timeout=timeout)


def probe_in_child(loader: str, paths: list[Path], timeout: float = 120) -> list[dict[str, str]]:
    """``probe`` each file in one child process; a crash or hang fails with the file it was on."""
    done = run_child(["probe", loader, *map(str, paths)], timeout)
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or len(results) != len(paths):
        culprit = paths[len(results)] if len(results) < len(paths) else "?"
        raise AssertionError(
            f"the {loader} loader died (exit {done.returncode}) on {culprit}; stderr:\n{done.stderr[-3000:]}"
        )
    return results


# --- Valid files to start from ---------------------------------------------------------------------------


def weights_bytes(dtype: str = "float32", seed: int = 0) -> bytes:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "w.npz"
        save_weights(path, CONFIG, random_weights(CONFIG, seed=seed, dtype=dtype))
        return path.read_bytes()


PARAMS_TYPE_FLAGS = {"float32": 0, "float64": 1, "float16": 2, "int32": 4, "int64": 6}
V2_MAGIC, V3_MAGIC = 0xF993FAC9, 0xF993FACA


def params_bytes(arrays: dict[str, np.ndarray] | list[tuple[str, np.ndarray]], magic: int = V3_MAGIC) -> bytes:
    """What ``npx.save`` (V3) or ``nd.save`` (V2) writes for named ``arrays``, written without MXNet."""
    items = list(arrays.items()) if isinstance(arrays, dict) else arrays
    out = bytearray(struct.pack("<QQQ", 0x112, 0, len(items)))
    for _, array in items:
        out += struct.pack("<Iii", magic, 0, array.ndim) + struct.pack(f"<{array.ndim}q", *array.shape)
        out += struct.pack("<iii", 1, 0, PARAMS_TYPE_FLAGS[array.dtype.name])
        out += np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    out += struct.pack("<Q", len(items))
    for name, _ in items:
        out += struct.pack("<Q", len(name.encode())) + name.encode()
    return bytes(out)


def gluon_weights(dtype: str = "float32", seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights under Gluon's structural names, as save_parameters writes them (the table needs no
    MXNet: bert_multi reads .params files itself)."""
    from bert_multi.backend import framework_names
    from bert_multi.files.formats.gluon import NAME_RULES

    weights = random_weights(CONFIG, seed=seed, dtype=dtype)
    return {framework_names(CONFIG, NAME_RULES)[name]: array for name, array in weights.items()}


def flax_bytes(dtype: str = "float32", seed: int = 0, wrapped: bool = False) -> bytes:
    """What ``flax.serialization.to_bytes`` writes for the JAX model's parameter tree (or the variables
    dict around it), written without Flax."""
    from bert_multi.files.formats.flax import flax_tree, pack_tree

    tree = flax_tree(CONFIG, random_weights(CONFIG, seed=seed, dtype=dtype))
    return pack_tree({"params": tree} if wrapped else tree)


def _msgpack_array(shape: bytes, dtype: bytes = b"\xa7float32", data: bytes = b"\xc4\x00") -> bytes:
    """One Flax array leaf (extension 1 around [shape, dtype, data]) from raw MessagePack pieces."""
    fields = b"\x93" + shape + dtype + data
    return b"\xc7" + bytes([len(fields)]) + b"\x01" + fields


def hostile_flax() -> dict[str, tuple[bytes, str]]:
    leaf = _msgpack_array(b"\x91\x01", data=b"\xc4\x04" + b"\0" * 4)  # float32 (1,)
    return {
        "a map of 2**32 - 1 entries": (b"\xdf\xff\xff\xff\xff\xa1w" + leaf, "claims 4294967295 entries"),
        "a key longer than the file": (b"\x81\xdb\x7f\xff\xff\xff", "needs 2147483647 bytes"),
        "nested 40 deep": (b"\x81\xa1a" * 40 + leaf, "nested over 16 levels"),
        "a shape of 2**62 x 2**62": (
            b"\x81\xa1w" + _msgpack_array(b"\x92" + (b"\xcf" + (2**62).to_bytes(8, "big")) * 2),
            "too large for any array",
        ),
        "a shape of 2**40, no data": (
            b"\x81\xa1w" + _msgpack_array(b"\x91\xcf" + (2**40).to_bytes(8, "big")),
            "data is a bin of 0 bytes",
        ),
        "a negative size": (b"\x81\xa1w" + _msgpack_array(b"\x91\xff"), "marker 0xFF"),
        "dtype object": (b"\x81\xa1w" + _msgpack_array(b"\x91\x01", b"\xa6object"), "dtype 'object'"),
        "extension type 2 (complex)": (b"\x81\xa1w\xd4\x02\x00", "extension type 2"),
        "a float leaf": (b"\x81\xa1w\xcb" + b"\0" * 8, "marker 0xCB"),
        "a key twice": (b"\x82\xa1w" + leaf + b"\xa1w" + leaf, "appears twice"),
        "bytes after the tree": (b"\x81\xa1w" + leaf + b"\x00", "1 unexpected bytes"),
        "a chunked array": (b"\x81\xda\x00\x19__msgpack_chunked_array__\xc3", "chunked array"),
        "a key that is not text": (b"\x81\xa2\xff\xfe" + leaf, "not UTF-8"),
        "a key that would write a line of its own": (b"\x81\xa8a\nb\x1b[31m" + leaf, "control character \\n"),
        "a list at the top": (b"\x91\x01", "does not start with a MessagePack map"),
        "empty file": (b"", "does not start with a MessagePack map"),
        "a Gluon .params file": (params_bytes(gluon_weights()), "does not start with a MessagePack map"),
        # Beside the parameters, as a TrainState holds its step and optimizer state: passed over, unread.
        "beside the parameters, 2**32 - 1 entries": (
            b"\x82\xa1s\xdf\xff\xff\xff\xff\xa6params\x81\xa1w" + leaf,
            "claims 4294967295 entries",
        ),
        "beside the parameters, a bin longer than the file": (b"\x82\xa1s\xc6\x7f\xff\xff\xff", "needs 2147483647"),
        "beside the parameters, nested 40 deep": (
            b"\x82\xa1s" + b"\x81\xa1a" * 40 + b"\x00\xa6params\x81\xa1w" + leaf,
            "nested over 16 levels",
        ),
        "beside the parameters, a marker MessagePack never uses": (b"\x82\xa1s\xc1\xa6params", "marker 0xC1"),
        "beside the parameters, 200,000 nils": (
            b"\x82\xa1s\xdd" + (200_000).to_bytes(4, "big") + b"\xc0" * 200_000 + b"\xa6params\x81\xa1w" + leaf,
            "over 100000 MessagePack items",
        ),
    }


def google_zip_bytes() -> bytes:
    """Google's TensorFlow BERT directory (the fixture) zipped as Google publishes one: under its folder."""
    return make_zip(
        [(f"uncased_L-2_H-8/{path.name}", path.read_bytes()) for path in sorted(TF_CHECKPOINT.iterdir())],
        zipfile.ZIP_DEFLATED,
    )


def hostile_zipped_directories() -> dict[str, tuple[bytes, str]]:
    config = (TF_CHECKPOINT / "bert_config.json").read_bytes()
    return {
        "a name above the zip": (make_zip([("../bert_config.json", config)]), "a name outside the zip's own"),
        "an absolute name": (make_zip([("/tmp/bert_config.json", config)]), "a name outside the zip's own"),
        "a file where a folder is": (
            make_zip([("a", b""), ("a/bert_config.json", config)]),
            "a damaged zip archive",
        ),
        "1,001 files": (make_zip([("bert_config.json", config), *((str(i), b"") for i in range(1000))]), "1001 files"),
        "zeros that expand beyond reason": (
            make_zip(
                [("bert_config.json", config), *((f"{i}", bytes(1 << 20)) for i in range(3))], zipfile.ZIP_DEFLATED
            ),
            "claim to expand to",
        ),
        "a config alone": (make_zip([("bert_config.json", config)]), "which is no checkpoint directory"),
    }


def hostile_orbax_metadata() -> dict[str, tuple[bytes, str]]:
    """An Orbax checkpoint's _METADATA, changed: only read to list the leaves it names in the refusal."""
    leaf = {"key_metadata": [{"key": "params", "key_type": 2}], "value_metadata": {}}
    return {
        "nested 200,000 deep": (b"[" * 200_000, "not the metadata Orbax writes"),
        "a list": (b"[]", "not the metadata Orbax writes"),
        "no tree_metadata": (b"{}", "not the metadata Orbax writes"),
        "a leaf without its keys": (json.dumps({"tree_metadata": {"a": {}}}).encode(), "key_metadata"),
        "keys that are not objects": (
            json.dumps({"tree_metadata": {"a": {"key_metadata": [1]}}}).encode(),
            "not the metadata Orbax writes",
        ),
        "a key that would write a line of its own": (
            json.dumps({"tree_metadata": {"a": {**leaf, "key_metadata": [{"key": "a\nb"}]}}}).encode(),
            "control character \\n",
        ),
        "not UTF-8": (b'{"tree_metadata": {"\xff": 1}}', "not the metadata Orbax writes"),
        "17 MiB": (b" " * (17 << 20), "over 16777216 bytes"),
    }


def hostile_deepspeed_latest() -> dict[str, tuple[bytes, str]]:
    """A DeepSpeed run's latest, changed: the tag of the save to read, a folder's name beside it."""
    expected = "expected the tag of DeepSpeed's last save"
    return {
        "empty": (b"", expected),
        "the run's parent": (b"..", expected),
        "a path out of the run": (b"../deepspeed-zero3/global_step2", expected),
        "an absolute path": (b"/global_step2", expected),
        "a control character": (b"global\x1bstep2", expected),
        "not UTF-8": (b"global_step\xff", expected),
        "1 MiB": (b"g" * (1 << 20), expected),
        "a save the run lacks": (b"global_step3", "holds no folder of that name"),
    }


EXPORTED_TABLE = "exported/data/weights/model_weights_config.json"


def with_exported_table(edit: Callable[[dict], object], data: bytes | None = None) -> bytes:
    """The exported program's archive (``data``, or the fixture's) with its table of weights edited in place."""
    members = zip_members(data if data is not None else EXPORTED.read_bytes())
    index = next(number for number, (name, _) in enumerate(members) if name == EXPORTED_TABLE)
    table = json.loads(members[index][1])
    edit(table["config"])
    members[index] = (EXPORTED_TABLE, json.dumps(table).encode())
    return make_zip(members)


def hostile_exported_programs() -> dict[str, tuple[bytes, str]]:
    """torch.export.save's archive of the fixture, its table of weights or its members changed."""
    word = "bert.embeddings.word_embeddings.weight"  # (13, 8) float64, in a storage of its own with the decoder

    def meta(**changed: object) -> Callable[[dict], object]:
        return lambda table: table[word]["tensor_meta"].update(changed)

    def sizes(*numbers: object) -> list[dict]:
        return [{"as_int": number} for number in numbers]

    members = zip_members(EXPORTED.read_bytes())
    return {
        "a tensor pickled": (with_exported_table(lambda table: table[word].update(use_pickle=True)), "as a pickle"),
        "a file it lacks": (with_exported_table(lambda table: table[word].update(path_name="weight_99")), "holds no"),
        "a file out of its folder": (
            with_exported_table(lambda table: table[word].update(path_name="../models/model.json")),
            "expected one of data/weights/",
        ),
        "more rows than its storage": (with_exported_table(meta(sizes=sizes(14, 8))), "reaches element"),
        "an offset past its storage": (with_exported_table(meta(storage_offset={"as_int": 2**40})), "reaches element"),
        "2**40 x 2**40 over one element": (
            with_exported_table(meta(sizes=sizes(2**40, 2**40), strides=sizes(0, 0))),
            "reaches element",
        ),
        "a size past 2**40": (with_exported_table(meta(sizes=sizes(2**41, 8))), "none symbolic"),
        "a symbolic size": (with_exported_table(meta(sizes=[{"as_expr": "s0"}, {"as_int": 8}])), "none symbolic"),
        "a negative stride": (with_exported_table(meta(strides=sizes(-8, 1))), "none symbolic"),
        "strides fewer than sizes": (with_exported_table(meta(strides=sizes(1))), "1 strides"),
        "a dtype it has no number for": (with_exported_table(meta(dtype=99)), "expected a strided tensor"),
        "a sparse layout": (with_exported_table(meta(layout=1)), "expected a strided tensor"),
        "no tensors": (with_exported_table(lambda table: table.clear()), "lists no tensors"),
        "a table not JSON": (
            make_zip([(name, b"{" if name == EXPORTED_TABLE else payload) for name, payload in members]),
            "is not JSON",
        ),
        "a table nested 100,000 deep": (
            make_zip([(name, b"[" * 100_000 if name == EXPORTED_TABLE else payload) for name, payload in members]),
            "is not JSON",
        ),
        "big-endian": (
            make_zip([(name, b"big" if name.endswith("/byteorder") else payload) for name, payload in members]),
            "byte order",
        ),
        "two programs": (
            make_zip([*members, (EXPORTED_TABLE.replace("model_", "other_"), b"{}")]),
            "holds 2 programs' weights",
        ),
        "every member deflated, claiming 4 GiB": (
            patch_zip(make_zip(members, zipfile.ZIP_DEFLATED), size=0xFFFFFFFF),
            "claims",
        ),
    }


PADDLE_FIXTURES = HERE.parent.parent / "conformance" / "original_d2l" / "checkpoints"  # saved by Paddle 2.6


def pdparams_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    from bert_multi.files.formats.paddle import write_pickle

    out = io.BytesIO()
    write_pickle(out, arrays)
    return out.getvalue()


def _pickled_array(count: int, data: bytes) -> bytes:
    """One float32 array of ``count`` elements as NumPy's recipe pickles it, ``data`` its bytes' opcodes."""
    recipe = (
        b"\x8c\x15numpy.core.multiarray\x8c\x0c_reconstruct\x93\x8c\x05numpy\x8c\x07ndarray\x93K\x00\x85C\x01b\x87R"
    )
    dtype = b"\x8c\x05numpy\x8c\x05dtype\x93\x8c\x02f4\x89\x88\x87R"
    dtype += b"(K\x03\x8c\x01<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"  # its state: little-endian
    return recipe + b"(K\x01(J" + struct.pack("<i", count) + b"t" + dtype + b"\x89" + data + b"tb"


def hostile_paddlenlp() -> dict[str, tuple[bytes, str]]:
    """A PaddleNLP BertForPretraining's model_state.pdparams, its names changed where a byte pattern finds them."""
    valid = (PADDLENLP / "model_state.pdparams").read_bytes()
    assert valid.count(b"layers.1.") == 16 and valid.count(b"self_attn.q_proj.weight") == 2, "the patterns find none"
    d2l = (PADDLE_FIXTURES / "d2l-0.17.6-paddle.pdparams").read_bytes()
    return {
        "a layer of another name": (
            valid.replace(b"q_proj.weight", b"x_proj.weight", 1),
            "no BERT layer bert_multi knows",
        ),
        "the fifth block": (valid.replace(b"layers.1.", b"layers.5."), "encoder.blks.5"),
        "d2l's names": (d2l, "no BERT layer bert_multi knows"),
        "cut short": (valid[: len(valid) // 2], "does not parse"),
        "empty file": (b"", "does not parse"),
    }


def hostile_paddlenlp2_configs() -> dict[str, tuple[bytes, str]]:
    """PaddleNLP 2.3's model_config.json of a BertForPretraining, its BertModel's arguments changed."""
    document = json.loads((PADDLENLP2 / "model_config.json").read_text())
    [bert] = document["init_args"]
    assert bert["init_class"] == "BertModel" and "vocab_size" in bert, "not the config the reproducers change"

    def changed(**arguments: object) -> bytes:
        given = {**bert, **arguments}
        return json.dumps({**document, "init_args": [{k: v for k, v in given.items() if v is not None}]}).encode()

    return {
        "no BertModel": (json.dumps({**document, "init_args": []}).encode(), "no argument of its 'BertForPretraining'"),
        "an argument of transformers'": (changed(layer_norm_eps=1e-5), "'layer_norm_eps' is not one PaddleNLP 2's"),
        "twice": (changed(init_args=[13]), "'vocab_size' is given both by position and by name"),
        "fifteen by position": (changed(init_args=list(range(15))), "not a list of at most 14 values"),
        "no vocabulary size": (changed(vocab_size=None), "give no vocab_size"),
        "a size as a string": (changed(hidden_size="8"), "hidden_size is '8'"),
        "fused layers": (changed(fuse=True), "model_config.json has fuse true"),
        "no class": (json.dumps(bert | {"init_class": None}).encode(), "expected an init_class (text)"),
        "not JSON": (b"{", "not valid JSON"),
    }


def hostile_paddlenlp3() -> dict[str, tuple[bytes, str]]:
    """PaddleNLP 3's bfloat16 model.safetensors (uint16 bits), its header changed."""
    valid = (PADDLENLP3 / "model.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", valid[:8])
    header = json.loads(valid[8 : 8 + size])
    assert header["__metadata__"] == {"format": "np"}, "not the file the reproducers change"

    def changed(metadata: object = header["__metadata__"], **renamed: str) -> bytes:
        entries = {renamed.get(name, name): entry for name, entry in header.items() if name != "__metadata__"}
        text = json.dumps({**entries, **({} if metadata is None else {"__metadata__": metadata})}).encode()
        return struct.pack("<Q", len(text)) + text + valid[8 + size :]

    q_proj = "bert.encoder.layers.0.self_attn.q_proj.weight"
    return {
        "transformers' metadata": (changed({"format": "pt"}), "metadata's format is 'pt', where PaddleNLP writes"),
        "no metadata": (changed(None), "metadata's format is None"),
        "a layer of another name": (changed(**{q_proj: q_proj.replace("q_proj", "x_proj")}), "no BERT layer"),
        "cut short": (valid[: len(valid) // 2], "not a readable safetensors file"),
    }


def hostile_paddle() -> dict[str, tuple[bytes, str]]:
    valid = pdparams_bytes({"w": np.arange(3, dtype=np.float32)})
    shape = b"(J\x03\x00\x00\x00t"
    assert valid.count(shape) == 1 and valid.count(b"\x8c\x02f4") == 1
    stored = b"\x8e" + struct.pack("<Q", 4096) + b"\0" * 4096 + b"\x94"  # MEMOIZE: memo 0
    shared = b"\x80\x04}(" + b"X\x01\x00\x00\x00a" + _pickled_array(1024, stored)
    shared += b"".join(
        b"X\x05\x00\x00\x00" + f"w{i:04d}".encode() + _pickled_array(1024, b"h\x00") for i in range(10_000)
    )
    system = b"cos\nsystem\n(S'touch /tmp/bert_multi-hostile'\ntR."  # os.system, were it unpickled
    return {
        "bytes claiming 2**62 of them": (b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b".", "does not parse"),
        "a shape claiming more than its bytes": (
            valid.replace(shape, b"(J\xe8\x03\x00\x00t"),
            "has 12 bytes, not 4000",
        ),
        "shape (2**62, 2**62)": (
            valid.replace(shape, b"(" + (b"\x8a\x08" + struct.pack("<q", 2**62)) * 2 + b"t"),
            "too large for any array",
        ),
        "a negative dimension": (valid.replace(shape, b"(J\xfb\xff\xff\xfft"), "invalid shape (-5,)"),
        "dtype object": (valid.replace(b"\x8c\x02f4", b"\x8c\x02O8"), "has dtype 'O8'"),
        "os.system at the top": (system, "a pickled os.system"),
        "os.system as a tensor": (b"\x80\x02}X\x01\x00\x00\x00w" + system[:-1] + b"s.", "not a state_dict"),
        "a memo never written": (b"\x80\x04h\x05.", "memo 5, which it never wrote"),
        "a pop of nothing": (b"\x80\x04R.", "pops more than it pushed"),
        "a tuple without its mark": (b"\x80\x04K\x01t.", "closes a mark it never set"),
        "a dict keyed by a tuple": (b"\x80\x04}(K\x01\x85K\x02u.", "a dict key that is a tuple"),
        "a list nested 100,000 deep": (b"\x80\x04" + b"]" * 100_000 + b"a" * 99_999 + b".", "it holds a list"),
        "bytes after the pickle": (valid + b"xyz", "3 bytes follow its pickle"),
        "a tensor cut into slices": (
            valid.replace(b"}(", b"}(\x8c\x15UnpackBigParamInfor@@}", 1),
            "cuts tensors over 1 GiB",
        ),
        "latin1 spelled in utf-8": (
            b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x05\x00\x00\x00utf-8\x86R.",
            "in the encoding",
        ),
        "one array's bytes under 10,000 names": (shared + b"u.", "its arrays claim"),
        "an empty dict": (b"\x80\x04}.", "holds no tensors"),
        "a protocol 5 buffer": (b"\x80\x05}(X\x01\x00\x00\x00w\x97u.", "not a state_dict"),
        "empty file": (b"", "does not parse"),
    }


def torch_bytes(state: object, **options) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer, **options)
    return buffer.getvalue()


def torch_state(dtype: str = "float32", seed: int = 0) -> dict:
    import torch

    return {name: torch.from_numpy(array) for name, array in random_weights(CONFIG, seed=seed, dtype=dtype).items()}


def npz_bytes(arrays: dict[str, np.ndarray], compressed: bool = False) -> bytes:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
    return buffer.getvalue()


def inputs_bytes(compressed: bool = False) -> bytes:
    return npz_bytes(
        {"tokens": np.array([[1, 2, 3]]), "segments": np.array([[0, 0, 1]]), "valid_lens": np.array([2])}, compressed
    )


# --- Surgery on zip archives and .npy members ------------------------------------------------------------


def zip_members(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def make_zip(members: list[tuple[str, bytes]], method: int = zipfile.ZIP_STORED) -> bytes:
    """A zip of ``members`` (duplicates allowed), with correct CRCs, so readers get past the zip layer."""
    buffer = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buffer, "w", method) as archive:
        warnings.simplefilter("ignore")  # "Duplicate name": wanted here
        for name, payload in members:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = method
            archive.writestr(info, payload)
    return buffer.getvalue()


def patch_zip(data: bytes, flags: int | None = None, method: int | None = None, size: int | None = None) -> bytes:
    """Overwrite the flags, compression method or uncompressed size of every local and central header."""
    out = bytearray(data)
    for signature, flag_at, method_at, size_at in ((b"PK\x03\x04", 6, 8, 22), (b"PK\x01\x02", 8, 10, 24)):
        start = out.find(signature)
        while start != -1:
            if flags is not None:
                out[start + flag_at : start + flag_at + 2] = struct.pack("<H", flags)
            if method is not None:
                out[start + method_at : start + method_at + 2] = struct.pack("<H", method)
            if size is not None:
                out[start + size_at : start + size_at + 4] = struct.pack("<I", size)
            start = out.find(signature, start + 4)
    return bytes(out)


def npy_bytes(header: bytes, data: bytes = b"", version: tuple[int, int] = (1, 0)) -> bytes:
    size = struct.pack("<H" if version == (1, 0) else "<I", len(header))
    return b"\x93NUMPY" + bytes(version) + size + header + data


def npy_header(descr: str = "<f4", shape: tuple = (3,), fortran: bool = False) -> bytes:
    return repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode() + b"\n"


def replace_member(data: bytes, name: str, payload: bytes) -> bytes:
    return make_zip([(n, payload if n == name else p) for n, p in zip_members(data)])


def with_manifest(data: bytes, edit: Callable[[dict], object]) -> bytes:
    """The weights file with its manifest JSON changed by ``edit`` (which may return a new document)."""
    members = dict(zip_members(data))
    manifest = json.loads(np.load(io.BytesIO(members["__manifest__.npy"])).tobytes())
    changed = edit(manifest)  # None (edited in place) or the whole new document as JSON text
    document = (json.dumps(manifest) if changed is None else changed).encode()
    return replace_member(data, "__manifest__.npy", npz_member(np.frombuffer(document, dtype=np.uint8)))


def npz_member(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def deflated_bomb(name: str, declared: int) -> bytes:
    """A deflated member that claims to expand to ``declared`` bytes (of zeros)."""
    payload = npy_bytes(npy_header("<f4", (declared // 4,)), b"\0" * 4096)
    return patch_zip(make_zip([(name, payload)], zipfile.ZIP_DEFLATED), size=min(declared, 0xFFFFFFFF))


# --- The reproducers: each a file a loader must refuse, and the words its error must contain ------------


def hostile_named_arrays() -> dict[str, tuple[bytes, str]]:
    """An .npz of named arrays without a manifest, changed: read as a state_dict is."""
    valid = named_arrays_bytes()
    token = "encoder.token_embedding.weight.npy"
    return {
        "an object array": (replace_member(valid, token, npy_bytes(npy_header("|O", (2,)))), "Python objects"),
        "a string array": (replace_member(valid, token, npy_bytes(npy_header("<U3", (2,)), b"\0" * 24)), "numbers"),
        "a member that is not .npy": (make_zip(zip_members(valid) + [("notes.txt", b"hi")]), "is not a .npy array"),
        "a zip bomb": (deflated_bomb(token, GIB3), "more than"),
        "shape (2**40,) in a header": (
            replace_member(valid, token, npy_bytes(npy_header("<f4", (2**40,)), b"\0" * 176)),
            "header declares",
        ),
        "names of no BERT": (make_zip([("a.npy", npz_member(np.zeros(3, np.float32)))]), "not those of a d2l BERT"),
    }


def hostile_weights() -> dict[str, tuple[bytes, str]]:
    valid = weights_bytes()
    token = "encoder.token_embedding.weight.npy"
    deep = "[" * 100_000 + "]" * 100_000
    many = make_zip(zip_members(valid) + [(f"extra{i}.npy", npz_member(np.zeros(1))) for i in range(20_000)])
    return {
        "member that is not .npy": (make_zip(zip_members(valid) + [("notes.txt", b"hello")]), "is not a .npy array"),
        "member with garbage data": (replace_member(valid, token, b"garbage"), "is unreadable"),
        "compression method 99": (patch_zip(valid, method=99), "compression method 99"),
        "encryption flag": (patch_zip(valid, flags=1), "is encrypted"),
        "deflated members": (make_zip(zip_members(valid), zipfile.ZIP_DEFLATED), "compression method 8"),
        "zip bomb": (deflated_bomb("__manifest__.npy", GIB3), "compression method 8"),
        "sizes that lie": (patch_zip(valid, size=GIB3), "declares"),
        "unterminated .npy header": (
            replace_member(valid, token, npy_bytes(b"{'descr': '<f4, 'fortran_order': False, 'shape': (11, 4)}\n")),
            "malformed .npy header",
        ),
        "nested .npy header": (replace_member(valid, token, npy_bytes(b"(" * 5000 + b")" * 5000)), "malformed"),
        "shape (2**40,) in a header": (
            replace_member(valid, token, npy_bytes(npy_header("<f4", (2**40,)), b"\0" * 176)),
            "header declares",
        ),
        "header longer than NumPy allows": (replace_member(valid, token, npy_bytes(b" " * 60_000)), "more than 10000"),
        "object array": (replace_member(valid, token, npy_bytes(npy_header("|O", (2,)))), "Python objects"),
        "shape (0, 2**62, 2**62) in a header": (
            replace_member(valid, token, npy_bytes(npy_header("<f4", (0, 2**62, 2**62)))),
            "too large for any array",
        ),
        "npy version 9": (replace_member(valid, token, npy_bytes(npy_header(), version=(9, 0))), "version (9, 0)"),
        "manifest nested 100,000 deep": (with_manifest(valid, lambda m: deep), "manifest is unreadable"),
        "num_blks 10**40": (with_manifest(valid, lambda m: m["config"].update(num_blks=10**40)), "missing tensor"),
        "vocab_size 10**40": (with_manifest(valid, lambda m: m["config"].update(vocab_size=10**40)), "has shape"),
        "max_len 10**12": (with_manifest(valid, lambda m: m["config"].update(max_len=10**12)), "has shape"),
        "manifest says float64, tensors are float32": (
            with_manifest(valid, lambda m: m.update(dtype="float64")),
            "the manifest says float64",
        ),
        "20,000 unlisted members": (many, "in the file but not in its manifest"),
        "20,000 listed tensors not in the file": (
            with_manifest(valid, lambda m: m["tensors"].update({f"ghost{i}": "0" * 64 for i in range(20_000)})),
            "listed in the manifest but missing from the file",
        ),
        "a member twice": (make_zip(zip_members(valid) + zip_members(valid)[:1]), "appears twice"),
        "a single .npy": (npz_member(np.zeros(3)), "holds a single array"),
        "empty file": (b"", "not a readable .npz file"),
        "a Gluon .params file": (params_bytes(gluon_weights()), "not a readable .npz file"),
    }


def _params_with(first_array: bytes) -> bytes:
    """A one-array .params file whose array record is ``first_array``, named 'w'."""
    return struct.pack("<QQQ", 0x112, 0, 1) + first_array + struct.pack("<Q", 1) + struct.pack("<Q", 1) + b"w"


def hostile_params() -> dict[str, tuple[bytes, str | dict[str, str]]]:
    one = np.arange(3, dtype=np.float32)
    valid = params_bytes({"w": one})
    return {
        "ndim 0xFFFFFFFF (V2)": (_params_with(struct.pack("<IiI", V2_MAGIC, 0, 0xFFFFFFFF)), "-1 dimensions"),
        "ndim 0x7FFFFFFF": (_params_with(struct.pack("<Iii", V3_MAGIC, 0, 0x7FFFFFFF)), "2147483647 dimensions"),
        "uninitialised parameter (V3, ndim -1)": (_params_with(struct.pack("<Iii", V3_MAGIC, 0, -1)), "deferred"),
        "a name that would write a line of its own": (params_bytes({"w\r\nignored: x": one}), "control character \\r"),
        "shape (2**40,)": (
            _params_with(struct.pack("<Iiiqiii", V3_MAGIC, 0, 1, 2**40, 1, 0, 0)),
            "needs 4398046511104 bytes",
        ),
        "negative dimension": (
            _params_with(struct.pack("<Iiiqiii", V3_MAGIC, 0, 1, -5, 1, 0, 0)),
            "invalid shape (-5,)",
        ),
        "shape (0, 2**62, 2**62)": (
            _params_with(struct.pack("<Iii3qiii", V3_MAGIC, 0, 3, 0, 2**62, 2**62, 1, 0, 0)),
            "too large for any array",
        ),
        "2**63 arrays": (struct.pack("<QQQ", 0x112, 0, 2**63), "claims 9223372036854775808 arrays"),
        "sparse storage": (_params_with(struct.pack("<Iii", V2_MAGIC, 1, 1)), "sparse"),
        "bfloat16": (_params_with(struct.pack("<Iiiqiii", V3_MAGIC, 0, 1, 3, 1, 0, 12) + b"\0" * 6), "type flag 12"),
        "non-UTF-8 name": (valid[:-1] + b"\xff", "not UTF-8"),
        "no names": (valid[:-17] + struct.pack("<Q", 0), "unnamed list"),
        "trailing bytes": (valid + b"xyz", "3 unexpected bytes"),
        "MXNet < 1.0 array": (_params_with(struct.pack("<II", 0xF993FAC8, 1)), "not an NDArray magic"),
        "a name twice": (params_bytes([("w", one), ("w", one)]), "appear more than once"),
        "a torch checkpoint": (
            zip_members_bytes(),
            {"params": "looks like a zip archive", "mxnet": "this is a PyTorch state_dict file"},
        ),
        "empty file": (b"", {"params": "looks like not a format", "mxnet": "not a format bert_multi reads"}),
    }


def zip_members_bytes() -> bytes:
    return make_zip([("archive/data.pkl", b"\x80\x02}q\x00.")])


def _legacy_claiming(torch, elements: int | None = None, count: bool = False) -> bytes:
    """A legacy torch.save file of one tensor, its storage's element count in the pickle (and, with
    ``count``, before its bytes too) changed to ``elements``."""
    import pickletools

    data = torch_bytes({"w": torch.arange(6.0)}, _use_new_zipfile_serialization=False)
    if elements is None:
        return data
    stream = io.BytesIO(data)
    stream.seek(_after_pickles(data, 3))  # the object's pickle, after the magic, protocol and system's sizes
    ops = list(pickletools.genops(stream))
    persid = next(i for i, (op, _, _) in enumerate(ops) if op.name == "BINPERSID")
    start = max(i for i in range(persid) if ops[i][0].name.startswith("BININT"))  # the id's count: its last number
    at, end = ops[start][2], ops[start + 1][2]
    assert ops[start][1] == 6, "the fixture's storage is no longer where this looks"
    data = data[:at] + b"\x8a\x08" + elements.to_bytes(8, "little") + data[end:]  # LONG1 of 8 bytes
    if count:
        data = data[:-32] + struct.pack("<q", elements) + data[-24:]  # the count, before its 6 float32s
    return data


def _after_pickles(data: bytes, count: int) -> int:
    """Where the first ``count`` pickles of ``data`` end."""
    import pickletools

    stream = io.BytesIO(data)
    for _ in range(count):
        list(pickletools.genops(stream))
    return stream.tell()


def _legacy_pickles(torch, count: int) -> bytes:
    """The first ``count`` pickles of an empty legacy torch.save file."""
    data = torch_bytes({}, _use_new_zipfile_serialization=False)
    return data[: _after_pickles(data, count)]


def _legacy_calling(torch) -> bytes:
    """A legacy torch.save file whose object is a pickle calling os.system (which must never run)."""
    return _legacy_pickles(torch, 3) + b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00echo\x85R." + b"\x80\x02]q\x00."


def hostile_torch() -> dict[str, tuple[bytes, str]]:
    import torch

    valid = torch_state()
    name = "hidden.0.bias"
    return {
        "bfloat16 tensor": (
            torch_bytes({**valid, name: valid[name].bfloat16()}),
            "is bfloat16; bert_multi computes in float32 or float64, and casts only when asked",
        ),
        "quantized tensor": (torch_bytes({**valid, name: quantized(valid[name])}), "is quantized"),
        "sparse tensor": (torch_bytes({**valid, name: valid[name].to_sparse()}), "is torch.sparse_coo"),
        "meta tensor": (torch_bytes({**valid, name: torch.empty(4, device="meta")}), "meta"),
        # The legacy format (before PyTorch 1.6): torch allocates each storage at the size its pickle claims.
        "a legacy storage claiming 2**40 elements": (_legacy_claiming(torch, 2**40), "but its bytes say otherwise"),
        "a legacy storage of 2**40 elements, its bytes saying so": (
            _legacy_claiming(torch, 2**40, count=True),
            "runs past the end of the file",
        ),
        "a legacy file cut short": (_legacy_claiming(torch)[:-10], "runs past the end of the file"),
        "a legacy file with bytes after its storages": (_legacy_claiming(torch) + b"\0" * 8, "8 bytes follow"),
        "a legacy file whose pickle calls os.system": (_legacy_calling(torch), "not a readable"),
        # Found by fuzzing: keys of other types than text, which could not be sorted.
        "a legacy list of storages of numbers": (
            _legacy_pickles(torch, 4) + b"\x80\x02]q\x00(K\x01X\x01\x00\x00\x00ae.",
            "its list of storages (2) is not the 0 its tensors name",
        ),
        "a Gluon .params file": (params_bytes(gluon_weights()), "this is a Gluon parameter file"),
        "records that lie about their size": (patch_zip(torch_bytes(valid), size=GIB3), "declare"),
        "garbage pickle": (zip_members_bytes_with_pickle(torch_bytes(valid), b"\x80\x02garbage"), "not a readable"),
        "a pickle calling os.system": (
            zip_members_bytes_with_pickle(torch_bytes(valid), b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00echo\x85R."),
            "not a readable",
        ),
        "an int64 tensor": (
            torch_bytes({**valid, name: valid[name].long()}),
            "has dtype int64; expected floating-point weights",
        ),
        "empty file": (b"", "not a format bert_multi reads"),
        # Round 3 (issue 26): each cost gigabytes before any check.
        "an expanded view": (torch_bytes({**valid, name: torch.zeros(1).expand(2**28)}), "is an expanded view"),
        "a thousand views of one storage": (torch_bytes(_aliased_views(torch)), "views that overlap or repeat"),
        # Round 5 (issue 56): an ignored head so named printed a line of the report of its own.
        "a name that would write a line of its own": (
            torch_bytes({**valid, "classifier\nignored: forged": torch.zeros(2)}),
            "control character \\n",
        ),
    }


def _aliased_views(torch):
    """A thousand overlapping views of one 4 MiB storage: what reading them would copy is 4 GB."""
    base = torch.zeros(1 << 20)
    return {f"w{i}": base[i:] for i in range(1000)}


def quantized(tensor):
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated: still loadable, so still tested
        return torch.quantize_per_tensor(tensor, 0.1, 0, torch.qint8)


def zip_members_bytes_with_pickle(data: bytes, pickle_bytes: bytes) -> bytes:
    return make_zip([(n, pickle_bytes if n.endswith("data.pkl") else p) for n, p in zip_members(data)])


def hostile_inputs() -> dict[str, tuple[bytes, str]]:
    return {
        "a single .npy": (npz_member(np.zeros(3, dtype=np.int64)), "holds a single array"),
        "zip bomb": (deflated_bomb("tokens.npy", GIB3), "allowed"),
        "object array": (
            make_zip([("tokens.npy", npy_bytes(npy_header("|O", (1,)))), ("segments.npy", npz_member(np.zeros(1)))]),
            "Python objects",
        ),
        "unknown array": (npz_bytes({"tokens": np.zeros((1, 2), int), "x": np.zeros(1)}), "expected arrays tokens"),
    }


MAP = {"names": {"encoder.blks.{i}.attention.W_q.{p}": "layers.{i}.qkv.{p}[0/3]", "mlm.mlp.0.weight": "head.T"},
       "ignore": ["classifier.weight"]}  # fmt: skip


_HF_FILES: dict[str, bytes] = {}


def huggingface_files() -> dict[str, bytes]:
    """A small original BERT saved as a HuggingFace directory: its config.json and model.safetensors."""
    if not _HF_FILES:
        from bert_multi import save_checkpoint

        config = BERTConfig(11, 4, 6, 2, 1, max_len=6, semantics="bert")
        with tempfile.TemporaryDirectory() as directory:
            save_checkpoint(Path(directory) / "hf", config, random_weights(config), framework="huggingface")
            for name in ("config.json", "model.safetensors"):
                _HF_FILES[name] = (Path(directory) / "hf" / name).read_bytes()
    return _HF_FILES


def d2l_safetensors_bytes() -> bytes:
    """A d2l BERT's tensors in a safetensors file (``safetensors.torch.save_file(net.state_dict())``)."""
    from bert_multi.files.formats.safetensors import write_safetensors

    with tempfile.TemporaryDirectory() as directory:
        write_safetensors(Path(directory) / "bert.safetensors", random_weights(CONFIG), {"format": "pt"})
        return (Path(directory) / "bert.safetensors").read_bytes()


SHARD_INDEX = "model.safetensors.index.json"


def huggingface_arrays() -> dict[str, np.ndarray]:
    """``huggingface_files()``' model.safetensors, read: transformers' names and arrays."""
    from bert_multi.files.formats.safetensors import read_safetensors

    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "model.safetensors").write_bytes(huggingface_files()["model.safetensors"])
        return read_safetensors(Path(directory) / "model.safetensors")[0]


def sharded_files() -> dict[str, bytes]:
    """``huggingface_files()``' model in two safetensors shards, their index, and its config.json."""
    from bert_multi.files.formats.safetensors import write_safetensors

    if SHARD_INDEX not in _HF_FILES:
        arrays = huggingface_arrays()
        with tempfile.TemporaryDirectory() as directory:
            halves = {name: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, name in enumerate(arrays)}
            for shard in sorted(set(halves.values())):
                part = {name: array for name, array in arrays.items() if halves[name] == shard}
                write_safetensors(Path(directory) / shard, part, {"format": "pt"})
                _HF_FILES[shard] = (Path(directory) / shard).read_bytes()
        _HF_FILES[SHARD_INDEX] = json.dumps({"metadata": {}, "weight_map": halves}).encode()
    shards = {name: data for name, data in _HF_FILES.items() if name.startswith("model-") or name == SHARD_INDEX}
    return {"config.json": huggingface_files()["config.json"], **shards}


def hostile_shard_indexes() -> dict[str, tuple[bytes, str]]:
    index = json.loads(sharded_files()[SHARD_INDEX])
    weight_map = index["weight_map"]

    def changed(**entries: str) -> bytes:
        return json.dumps({**index, "weight_map": {**weight_map, **entries}}).encode()

    return {
        "a shard outside the directory": (changed(w="../model.safetensors"), "not a file name of its directory"),
        "a hidden shard": (changed(w=".model.safetensors"), "not a file name of its directory"),
        "a shard of no file": (changed(w="model-00003-of-00002.safetensors"), "no such safetensors file"),
        "a tensor no shard holds": (changed(w="model-00001-of-00002.safetensors"), "which no shard holds"),
        "a map of numbers": (json.dumps({"weight_map": {"w": 7}}).encode(), "maps names to files"),
        "deeply nested": (b"[" * 200_000, "not a JSON object"),
        "over 1 MB": (b" " * (1 << 20) + b"{}", "at most 1048576 bytes"),
    }


def _safetensors_with(*entries: tuple[str, dict]) -> bytes:
    """The valid file's data under a header of ``entries`` as written (a name may repeat)."""
    data = huggingface_files()["model.safetensors"]
    (size,) = struct.unpack("<Q", data[:8])
    text = "{" + ", ".join(f"{json.dumps(name)}: {json.dumps(entry)}" for name, entry in entries) + "}"
    return struct.pack("<Q", len(text)) + text.encode() + data[8 + size :]


def hostile_safetensors() -> dict[str, tuple[bytes, str]]:
    def entry(dtype: object = "F32", shape: object = (1,), offsets: tuple = (0, 4)) -> dict:
        return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}

    return {
        "a dtype that is a list": (_safetensors_with(("a", entry(["F32"]))), "has dtype"),
        "33 axes": (_safetensors_with(("a", entry(shape=[1] * 33))), "at most 32 axes"),
        "a name twice": (_safetensors_with(("a", entry()), ("a", entry())), "appears twice"),
        "overlapping": (
            _safetensors_with(("a", entry(shape=[2], offsets=(0, 8))), ("b", entry(shape=[2], offsets=(4, 12)))),
            "overlap",
        ),
    }


def hostile_hfconfigs() -> dict[str, tuple[bytes, str]]:
    document = json.loads(huggingface_files()["config.json"])

    def changed(**fields: object) -> bytes:
        return json.dumps({**document, **fields}).encode()

    return {
        "Infinity": (changed(vocab_size=float("inf")), "vocab_size is inf"),
        "a million layers": (changed(num_hidden_layers=10**6), "num_hidden_layers is 1000000"),
        "heads as true": (changed(num_attention_heads=True), "num_attention_heads is True"),
        "a size as a string": (changed(hidden_size="4"), "hidden_size is '4'"),
        "not JSON": (b"{", "not valid JSON"),
    }


def hostile_keras_hub_configs() -> dict[str, tuple[bytes, str]]:
    """A KerasHub BertBackbone's config.json, changed: its class, its arguments' types and sizes."""
    document = json.loads((KERAS_HUB / "config.json").read_text())

    def changed(**arguments: object) -> bytes:
        return json.dumps({**document, "config": {**document["config"], **arguments}}).encode()

    def task(backbone: object) -> bytes:
        return json.dumps({"class_name": "BertMaskedLM", "config": {"backbone": backbone}}).encode()

    return {
        "arguments as a list": (
            json.dumps({**document, "config": [1, 2]}).encode(),
            "where a BertBackbone's arguments are an object",
        ),
        "a class as an object": (
            json.dumps({**document, "class_name": {"a": 1}}).encode(),
            "its class_name is {'a': 1}",
        ),
        "a task whose backbone is text": (task("BertBackbone"), "its class_name is 'BertMaskedLM'"),
        "a task whose backbone is another's": (
            task({"class_name": "GPT2Backbone"}),
            "holds a backbone whose class_name is 'GPT2Backbone'",
        ),
        "a million layers": (changed(num_layers=10**6), "where its config's num_layers is 1000000"),
        "a size as a string": (changed(hidden_dim="8"), "hidden_dim is '8'"),
        "no vocabulary size": (changed(vocabulary_size=None), "vocabulary_size is None"),
        "segments as true": (changed(num_segments=True), "num_segments is True"),
        "dropout as NaN": (changed(dropout=float("nan")), "dropout is nan"),
        "not JSON": (b"[", "not valid JSON"),
    }


def hostile_tf2_data() -> dict[str, tuple[bytes, str]]:
    """A SavedModel's variables data, whose first tensor is its object graph, changed where a pattern finds it."""
    from bert_multi.files.formats.tensorflow import read_index

    valid = (TF2_SAVED / "variables" / "variables.data-00000-of-00001").read_bytes()
    at = read_index(TF2_SAVED / "variables" / "variables.index")[0]["_CHECKPOINTABLE_OBJECT_GRAPH"].offset
    name = b"pooler_transform/kernel"
    assert valid.count(name) == 1, "the pattern no longer finds the pooler's name in the object graph"
    return {
        "a graph longer than its tensor": (valid[:at] + b"\xff\xff\x03" + valid[at + 3 :], "its object graph says"),
        "a graph that is no protocol buffer": (
            valid[: at + 6] + b"\xff" * 40 + valid[at + 46 :],
            "its object graph is malformed",
        ),
        "a variable of another name": (valid.replace(name, b"pooler_transform/kernex"), "pooler_transform/kernex"),
        "two variables of one name": (
            valid.replace(b"transformer/layer_1/output/kernel", b"transformer/layer_0/output/kernel"),
            "'transformer/layer_0/output/kernel' and 'transformer/layer_0/output/kernel' are both "
            "encoder.blks.0.ffn.dense2.weight",
        ),
        "a name that ends a line": (valid.replace(name, b"pooler_transform/kerne\n"), "no BertEncoder layer"),
        "cut short": (valid[: len(valid) // 2], "lie past its end"),
    }


def hostile_tf2_indexes() -> dict[str, tuple[bytes, str]]:
    """A SavedModel's variables index: TensorFlow 1's in its place, or an object graph that is no scalar."""
    graph = b"_CHECKPOINTABLE_OBJECT_GRAPH"
    return {
        "TensorFlow 1's index": ((TF_CHECKPOINT / "bert_model.ckpt.index").read_bytes(), "a TensorFlow 1 checkpoint"),
        "a graph of a matrix's shape": (
            tf_index_bytes([TF_HEADER, (graph, tf_entry(dtype=7, shape=(2, 2), size=40))]),
            "its object graph is of shape (2, 2)",
        ),
        "a graph of 2**40 bytes": (
            tf_index_bytes([TF_HEADER, (graph, tf_entry(dtype=7, shape=(), size=2**40))]),
            "its object graph is of shape () and 1099511627776 bytes",
        ),
        "empty file": (b"", "where an index is"),
    }


def hostile_hf_flax() -> dict[str, tuple[bytes, str]]:
    from bert_multi.files.formats.flax import nested, pack_tree, read_tree

    tree, _ = read_tree(HF_FLAX / "flax_model.msgpack")
    kernel = tree["pooler.dense.kernel"]

    def changed(**leaves: np.ndarray) -> bytes:
        changes = {name.replace("__", "."): array for name, array in leaves.items()}
        return pack_tree(nested({**tree, **changes}))

    return {
        "a kernel beside its weight": (changed(pooler__dense__weight=kernel), "are both pooler.dense.weight"),
        "a kernel of 3 axes": (changed(pooler__dense__kernel=kernel[None]), "hidden.0.weight"),
        "a kernel of other sizes": (changed(pooler__dense__kernel=kernel[:4]), "hidden.0.weight"),
        "a leaf of no BERT layer": (changed(pooler__dense__gamma_prime=kernel), "pooler.dense.gamma_prime"),
        "d2l's Flax tree": (flax_bytes(), "tensors of no BERT layer bert_multi knows"),
        "a Gluon .params file": (params_bytes(gluon_weights()), "does not start with a MessagePack map"),
    }


def hostile_hf_h5() -> dict[str, tuple[bytes, str | dict[str, str]]]:
    """Keras's tf_model.h5, its structure changed where a byte pattern finds it (h5py is not needed)."""
    valid = (HF_TF / "tf_model.h5").read_bytes()
    word = struct.pack("<QQ", 13, 8)  # the word embeddings' dataspace: (13, 8), the only such shape
    at = valid.index(word)
    layout = valid.index(b"\x03\x01", at)  # the layout message after it: contiguous, then address and size
    address, size = struct.unpack_from("<QQ", valid, layout + 2)
    assert size == 13 * 8 * 4, "the patterns no longer find the word embeddings in the fixture"
    root_count = 96 + 2  # the root group's object header (after the superblock): its message count
    snod = valid.index(b"SNOD")  # a symbol table node: 8 bytes, then entries (name offset, object header)
    heap_name = valid.index(b"\0gamma:0\0beta:0\0") + 1  # a LayerNorm group's names, in its local heap

    def changed(at: int, new: bytes, data: bytes = valid) -> bytes:
        return data[:at] + new + data[at + len(new) :]

    return {
        "cut short": (valid[: len(valid) // 2], "cut short"),
        "superblock version 2": (changed(8, b"\x02"), "superblock version 2"),
        "addresses of 4 bytes": (changed(13, b"\x04"), "addresses of 4 bytes"),
        "a user block": (changed(24, struct.pack("<Q", 512)), "a user block"),
        "the root at byte 0": (changed(56 + 8, struct.pack("<Q", 0)), "object header of version 137"),
        "a header of 65535 messages": (changed(root_count, b"\xff\xff"), "65535 messages"),
        "a member that is its own group": (changed(snod + 16, struct.pack("<Q", 96)), "already read"),
        "a name past its heap": (changed(snod + 8, struct.pack("<Q", 2**40)), "outside its heap"),
        "a shape of 2**40 x 8": (changed(at, struct.pack("<Q", 2**40)), "not its shape's"),
        "a shape of 2**62 x 2**62": (changed(at, struct.pack("<QQ", 2**62, 2**62)), "too large for any array"),
        "a chunked dataset": (changed(layout, b"\x03\x02"), "is stored chunked"),
        "values past the end": (changed(layout + 2, struct.pack("<Q", 2**62)), "not within the file"),
        "values inside another's": (changed(layout + 2, struct.pack("<Q", address + 4)), "overlap"),
        "integers": (changed(valid.index(b"\x11\x20\x1f\x00", at), b"\x10"), "type class 0"),
        "floats of 3 bytes": (changed(valid.index(b"\x11\x20\x1f\x00", at) + 4, b"\x03"), "floats of 3 bytes"),
        # Alone, a file is read by what it holds, whatever its name: a Gluon file named .h5 is read as Gluon's.
        "a Gluon .params file": (
            params_bytes(gluon_weights()),
            {"hfh5": "does not start with HDF5's signature", "h5alone": "state preset= or d2l_version="},
        ),
        "empty file": (b"", {"hfh5": "does not start with HDF5's signature", "h5alone": "not a format bert_multi"}),
        "two members named alike": (changed(heap_name, b"beta:0\0"), "appears twice"),
    }


def hostile_keras_hub() -> dict[str, tuple[bytes, str]]:
    """A KerasHub preset's model.weights.h5 (Keras 3's names: the place of each weight in the model), its
    shapes and names changed where a byte pattern finds them."""
    valid = (KERAS_HUB / "model.weights.h5").read_bytes()

    def space(*dims: int) -> bytes:  # a dataspace's dimensions, then its maximum ones (the same)
        return struct.pack(f"<{2 * len(dims)}Q", *dims, *dims)

    kernel, output, table = space(8, 2, 4), space(2, 4, 8), space(16, 8)  # an attention's; the position table
    assert (valid.count(kernel), valid.count(output), valid.count(table)) == (6, 2, 1), "the patterns find none"
    return {
        "four heads in a query kernel": (valid.replace(kernel, space(8, 4, 2), 1), "it holds 4 heads"),
        "four heads in an output kernel": (valid.replace(output, space(4, 2, 8), 1), "it holds 4 heads"),
        "a position table turned": (valid.replace(table, space(8, 16)), "has shape (1, 8, 16), expected (1, 16, 8)"),
        "a layer of another name": (
            valid.replace(b"reversible_embedding\0", b"reversible_embeddinX\0"),
            "weights of no BertBackbone layer bert_multi knows",
        ),
        "the fifth block": (
            valid.replace(b"transformer_encoder_1\0", b"transformer_encoder_5\0"),
            "it holds the blocks [0, 5], where its config's num_layers is 2",
        ),
        "transformers' tf_model.h5": ((HF_TF / "tf_model.h5").read_bytes(), "weights of no BertBackbone layer"),
        "bfloat16, as Keras 3 stores it": (
            valid.replace(b"\x11\x20\x1f\x00", b"\x15\x20\x1f\x00", 1),
            "as Keras 3 stores bfloat16: save the model in float32",
        ),
        "cut short": (valid[: len(valid) // 2], "cut short"),
        "empty file": (b"", "does not start with HDF5's signature"),
    }


def _varint(number: int) -> bytes:
    out = bytearray()
    while number >= 0x80:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    return bytes(out + bytes([number]))


def _proto(*fields: tuple[int, int | bytes]) -> bytes:
    """A protocol-buffer message of (field number, a varint or a length-delimited value)."""
    return b"".join(
        _varint(number << 3) + _varint(value) if isinstance(value, int) else
        _varint(number << 3 | 2) + _varint(len(value)) + value
        for number, value in fields
    )  # fmt: skip


def tf_entry(dtype: int = 1, shape: tuple[int, ...] = (13, 8), offset: int = 0, size: int = 416, **more: int) -> bytes:
    """A BundleEntryProto: dtype, shape, offset and size (``more``: other fields by number, ``f3=`` the shard)."""
    dims = _proto(*((2, _proto((1, dim))) for dim in shape))
    return _proto((1, dtype), (2, dims), (4, offset), (5, size), *((int(k[1:]), v) for k, v in more.items()))


TF_HEADER = (b"", _proto((1, 1), (3, _proto((1, 1)))))  # one shard, little-endian, version 1


def tf_index_bytes(
    records: list[tuple[bytes, bytes]], compression: int = 0, restarts: int = 1, handle: bytes | None = None
) -> bytes:
    """A TensorFlow checkpoint index (a LevelDB table) of one data block holding ``records``, written without
    TensorFlow; ``handle``: the index block's record in place of the data block's handle."""
    block = b"".join(_varint(0) + _varint(len(k)) + _varint(len(v)) + k + v for k, v in records)
    block += struct.pack("<I", 0) * min(restarts, 1) + struct.pack("<I", restarts)
    data = block + bytes([compression]) + b"\0" * 4
    index = _varint(0) + _varint(1) + _varint(len(handle or b"")) + b"\xff" + (handle or b"")
    if handle is None:
        value = _varint(0) + _varint(len(block))
        index = _varint(0) + _varint(1) + _varint(len(value)) + b"\xff" + value
    index += struct.pack("<II", 0, 1)
    meta = struct.pack("<II", 0, 1)
    out = data + meta + b"\0" * 5 + index + b"\0" * 5
    footer = _varint(len(data)) + _varint(len(meta)) + _varint(len(data) + len(meta) + 5) + _varint(len(index))
    return out + footer.ljust(40, b"\0") + struct.pack("<Q", 0xDB4775248B80FB57)


def hostile_tf_indexes() -> dict[str, tuple[bytes, str]]:
    valid = (TF_CHECKPOINT / "bert_model.ckpt.index").read_bytes()
    word = b"bert/embeddings/word_embeddings"

    def one(entry: bytes, name: bytes = word) -> bytes:
        return tf_index_bytes([TF_HEADER, (name, entry)])

    return {
        "no magic at the end": (valid[:-1] + b"\0", "does not end with a LevelDB table's magic number"),
        "shorter than a footer": (valid[-20:], "20 bytes, where an index is 48 bytes"),
        "a block past the end": (
            tf_index_bytes([TF_HEADER], handle=_varint(2**40) + _varint(8)),
            "past the file's",
        ),
        "a compressed block (snappy)": (tf_index_bytes([TF_HEADER], compression=1), "compressed with method 1"),
        "2**32 - 1 restart points": (tf_index_bytes([TF_HEADER], restarts=2**32 - 1), "claims 4294967295 restart"),
        "a number of 11 bytes": (tf_index_bytes([TF_HEADER], handle=b"\xff" * 11), "a number longer than 10 bytes"),
        "a string tensor": (one(tf_entry(dtype=7)), "holds text, where weights are numbers"),
        "an entry of 2 KB": (one(tf_entry() + _proto((9, b"x" * 2048))), "a record of 2"),
        "a name of 2 KB": (one(tf_entry(), b"x" * 2048), "a key of over 1024 bytes"),
        "100,002 headers": (tf_index_bytes([TF_HEADER] * 100_002), "it holds over 100000 records"),
        "an index of 5 MiB": (b"\0" * (5 << 20) + valid[-48:], "where an index is 48 bytes to 4 MiB"),
        "33 axes": (one(tf_entry(shape=(1,) * 33)), "more than 32 axes"),
        "an axis of 2**62": (one(tf_entry(shape=(2**62, 2))), "an axis past 2**62"),
        "a shape of 2**40 x 2**40": (one(tf_entry(shape=(2**40, 2**40))), "too large for any array"),
        "a partitioned variable": (one(tf_entry(f7=b"")), "saved in slices"),
        "big-endian": (tf_index_bytes([(b"", _proto((1, 1), (2, 1))), (word, tf_entry())]), "big-endian"),
        "no header": (tf_index_bytes([(word, tf_entry())]), "its header gives None data shards"),
        "a name twice": (tf_index_bytes([TF_HEADER, (word, tf_entry()), (word, tf_entry())]), "appears twice"),
        "a name that would write a line of its own": (one(tf_entry(), b"bert/\n\x1b[31m"), "control character \\n"),
        "a name not UTF-8": (one(tf_entry(), b"\xff\xfe"), "not UTF-8"),
        "data past the end of the shard": (one(tf_entry(offset=2**40)), "not within the file's"),
        "a size that is not the shape's": (one(tf_entry(size=4)), "claims 4 bytes at 0"),
        "in shard 3 of 1": (one(tf_entry(f3=3)), "is in shard 3 of 1"),
        "two tensors in the same bytes": (
            tf_index_bytes(
                [TF_HEADER, (word, tf_entry()), (b"bert/embeddings/LayerNorm/beta", tf_entry(shape=(8,), size=32))]
            ),
            "overlap in the data",
        ),
        "a tensor of no BERT layer": (one(tf_entry(), b"bert/encoder/layer_0/attention/oops"), "no BERT layer"),
    }


def state_bytes(**changes: object) -> bytes:
    """A training state of CONFIG after a step of Adam (moments of every parameter), as saved."""
    import dataclasses

    from bert_multi.training import TrainingState, save_training_state

    weights = random_weights(CONFIG, seed=0, dtype="float32")
    optimizer = {f"{kind}.{name}": np.full_like(array, 0.5) for name, array in weights.items() for kind in "mv"}
    state = TrainingState(2, CONFIG, weights, optimizer, {"backend": "torch", "optimizer": "adam"})
    state = TrainingState(**{**state._asdict(), **changes})
    if "num_blks" in changes:
        state = state._replace(config=dataclasses.replace(CONFIG, num_blks=changes["num_blks"]))
    # Past the check that refuses to save a state a run could not resume from: the file is made to be bad.
    with tempfile.TemporaryDirectory() as directory, mock.patch("bert_multi.spec.training_state.check_optimizer_state"):
        return save_training_state(directory, state).read_bytes()


def hostile_states() -> dict[str, tuple[bytes, str]]:
    weights = random_weights(CONFIG, seed=0, dtype="float32")
    name = next(iter(weights))
    wrong_shape = {f"m.{name}": np.zeros(2, np.float32), f"v.{name}": np.zeros(2, np.float32)}
    alone = {f"m.{name}": np.zeros_like(weights[name])}
    return {
        "a step of true": (state_bytes(step=True), "its step is True"),
        "a moment of the wrong shape": (state_bytes(optimizer=wrong_shape), "its parameter is"),
        "a moment without its partner": (state_bytes(optimizer=alone), "no partner"),
        "Adam's steps with no moments": (state_bytes(optimizer={}), "no Adam moments for 29 of the 29 parameters"),
    }


def vocab_bytes() -> bytes:
    return json.dumps([f"t{i}" for i in range(CONFIG.vocab_size)]).encode()


def hostile_vocabs() -> dict[str, tuple[bytes, str]]:
    return {
        "lists, not tokens": (b"[" + b"[]," * 100_000 + b"[]]", "a JSON list of tokens"),
        "too few tokens": (b'["a"]', "has 1 tokens, but the token embedding has 11 rows"),
        "not UTF-8 inside a string": (b'["\xff"]', "not valid JSON"),
    }


def corpus_bytes() -> bytes:
    from bert_multi.training import builtin_corpus

    return "\n".join(builtin_corpus(20)).encode()


def hostile_d2l_zips() -> dict[str, tuple[bytes, str]]:
    whole, params = d2l_zip_bytes(), d2l_params_bytes()
    return {
        "two parameter files": (
            make_zip([("a/pretrained.params", params), ("b/pretrained.params", params)]),
            "found 2",
        ),
        "cut short": (whole[: len(whole) // 2], "zip"),
    }


def hostile_keras_files() -> dict[str, tuple[bytes, str]]:
    """.keras files (model.save's zip) of a KerasHub BertMaskedLM, changed: its members, its config."""
    whole = (KERAS_HUB.parent / "keras-hub-masked-lm.keras").read_bytes()
    with zipfile.ZipFile(io.BytesIO(whole)) as archive:
        config, weights = json.loads(archive.read("config.json")), archive.read("model.weights.h5")
    backbone = (KERAS_HUB / "model.weights.h5").read_bytes()

    def keras(config: object, weights: bytes = weights, method: int = zipfile.ZIP_STORED) -> bytes:
        return make_zip([("config.json", json.dumps(config).encode()), ("model.weights.h5", weights)], method)

    with zipfile.ZipFile(io.BytesIO(whole)) as archive:
        stored = archive.getinfo("model.weights.h5")
    data_at = stored.header_offset + 30 + len(stored.filename) + len(stored.extra)  # its bytes, read in place
    flipped = whole[: data_at + 600] + bytes([whole[data_at + 600] ^ 1]) + whole[data_at + 601 :]
    moved = whole[: stored.header_offset] + b"XX" + whole[stored.header_offset + 2 :]
    roberta = {
        **config,
        "config": {**config["config"], "backbone": {**config["config"]["backbone"], "class_name": "RobertaBackbone"}},
    }
    return {
        "cut short": (whole[: len(whole) // 2], "zip"),
        "a bit of the weights flipped": (flipped, "its bytes do not match the zip's checksum"),
        "the weights' local header gone": (moved, "local header is not where the zip's directory says"),
        "no weights": (make_zip([("config.json", json.dumps(config).encode())]), "which is no checkpoint directory"),
        "config.json not JSON": (make_zip([("config.json", b"{"), ("model.weights.h5", weights)]), "not valid JSON"),
        "a RoBERTa's backbone": (
            keras(roberta),
            "its task 'BertMaskedLM' holds a backbone whose class_name is 'RobertaBackbone'",
        ),
        "a task's config over a backbone's weights": (keras(config, backbone), "no weights in 'layers/bert_backbone'"),
        "weights that claim to expand 2000 times": (
            keras(config, bytes(2 << 20), zipfile.ZIP_DEFLATED),
            "claims to expand",
        ),
        "weights that are no HDF5": (keras(config, b"\x89PNG\r\n\x1a\n" + bytes(64)), "HDF5's signature"),
    }


def hostile_corpora() -> dict[str, tuple[bytes, str]]:
    return {
        "not UTF-8": (b"a . b\n\xff\xfe . c", "not UTF-8 text"),
        "no sentence pairs": (b"one sentence only\n", "no sentence pair"),
    }


def hostile_maps() -> dict[str, tuple[bytes, str]]:
    return {
        "not UTF-8": (b"\xff\xfe{}", "not a JSON map file"),
        "deeply nested": (b"[" * 200_000, "not a JSON map file"),
        "a list": (b"[]", "expected an object"),
        "an unknown key": (b'{"rename": {}}', "expected an object"),
        "a number as a name": (b'{"names": {"a": 7}}', "must map canonical names to strings"),
        "a part past the end": (b'{"names": {"a": "b[3/3]"}}', "does not exist"),
        "ignore not a list": (b'{"ignore": "x"}', "must be a list"),
        "a pooler output of a list": (b'{"pooler_output": ["pool"]}', "must be a module's path"),
        "a pooler output of control characters": (b'{"pooler_output": "pool\\u0000"}', "must be a module's path"),
        "two megabytes": (b'{"ignore": ["' + b"x" * (2 << 20) + b'"]}', "is not one"),
        # Round 4 (issue 40): a list of a hundred million parts, Python's int-string limit.
        "a hundred million parts": (b'{"names": {"a": "b[0/100000000]"}}', "expected at most 1024"),
        "a part number of 4,300 digits": (
            b'{"names": {"a": "b[0/' + b"9" * 4300 + b']"}}',
            "numbers of at most 9 digits",
        ),
        "a pattern that names nothing": (b'{"names": {"encoder.blks.{i}.{i}": "b"}}', "names no canonical tensor"),
    }


def _with_tensor(name: str, array: np.ndarray) -> dict[str, np.ndarray]:
    """CONFIG's canonical weights with tensor ``name`` replaced."""
    return {**random_weights(CONFIG), name: array}


def flax_file_of(weights: dict[str, np.ndarray]) -> bytes:
    from bert_multi.files.formats.flax import flax_tree, pack_tree

    return pack_tree(flax_tree(CONFIG, weights))


def hostile_checkpoints() -> dict[str, tuple[bytes, str]]:
    """Files whose structure reads, and whose numbers would then size the work of interpreting them, or
    whose dtype is read widened."""
    from bert_multi.backend import framework_names
    from bert_multi.files.formats.gluon import NAME_RULES

    empty = np.zeros((0, 2**40), np.float32)  # no bytes, whatever the other axis claims
    gluon = framework_names(CONFIG, NAME_RULES)
    cases = {
        "a Flax embedding of 0 x 2**40": (
            flax_file_of(_with_tensor("encoder.token_embedding.weight", empty)),
            "holds no values",
        ),
        "a Flax FFN of 0 x 2**40": (
            flax_file_of(_with_tensor("encoder.blks.0.ffn.dense1.weight", empty.T)),
            "no values",
        ),
        "a Gluon embedding of 0 x 2**40": (
            params_bytes(
                {gluon[name]: array for name, array in _with_tensor("encoder.token_embedding.weight", empty).items()}
            ),
            "holds no values",
        ),
    }
    with contextlib.suppress(ImportError):  # NumPy's bfloat16, where JAX is installed
        import ml_dtypes

        cases["a bfloat16 Flax file"] = (
            flax_file_of({name: array.astype(ml_dtypes.bfloat16) for name, array in random_weights(CONFIG).items()}),
            "is bfloat16; bert_multi computes in float32 or float64, and casts only when asked",
        )
    try:
        import torch
    except ImportError:
        return cases
    state = torch_state()
    state["encoder.token_embedding.weight"] = torch.zeros((0, 2**40))
    cases["a PyTorch embedding of 0 x 2**40"] = (torch_bytes(state), "holds no values")
    transformers = transformers_state()
    cases["a transformers state_dict short of a layer"] = (
        torch_bytes({name: array for name, array in transformers.items() if "layer.0.output.dense" not in name}),
        "but it lacks ['encoder.layer.0.output.dense.weight', 'encoder.layer.0.output.dense.bias']",
    )
    untied = {
        **transformers,
        "cls.predictions.decoder.weight": transformers["bert.embeddings.word_embeddings.weight"] + 1,
    }
    cases["a transformers state_dict of an untied decoder"] = (torch_bytes(untied), "not its word embeddings")
    far = {**transformers, "bert.encoder.layer.1099511627776.output.dense.bias": torch.zeros(4)}  # block 2**40
    cases["a transformers state_dict naming block 2**40"] = (torch_bytes(far), "'encoder.layer.1.attention.self")
    return cases


def transformers_state() -> dict:
    """``huggingface_files()``' BERT as transformers' state_dict: its names, as torch tensors."""
    import torch

    return {name: torch.from_numpy(array.copy()) for name, array in huggingface_arrays().items()}


def reply_bytes() -> bytes:
    """A worker's reply to 'forward', as np.savez writes it."""
    from bert_multi.backend.registry import load_backend

    output = load_backend("numpy").build(CONFIG, random_weights(CONFIG))(np.array([[1, 2, 3]]), np.zeros((1, 3), int))
    return npz_bytes({"encoded": output.encoded, "nsp": output.nsp})


def hostile_replies() -> dict[str, tuple[bytes, str]]:
    valid = zip_members(reply_bytes())
    return {
        "compressed": (npz_bytes({"encoded": np.zeros(1 << 16)}, compressed=True), "compression method 8"),
        "an inflating bomb": (deflated_bomb("encoded.npy", GIB3), "compression method 8"),
        "not a zip": (b"PK\x03\x04 not a zip at all", "not a readable .npz file"),
        "an object array": (make_zip([("encoded.npy", npy_bytes(npy_header("|O", (1,))))]), "Python objects"),
        "a member twice": (make_zip(valid + valid), "appears twice"),
    }


CACHE_KEY = "jit_forward-0123456789abcdef"


def cache_entry_bytes(key: str = CACHE_KEY) -> bytes:
    """A compilation cache entry as bert_multi seals it (the program's bytes are JAX's business)."""
    from bert_multi.cache import seal

    return seal(key, zlib.compress(bytes(range(256)) * 64))


def hostile_cache_entries() -> dict[str, tuple[bytes, str]]:
    valid = cache_entry_bytes()
    return {
        "another program's entry": (cache_entry_bytes("jit_other-fedcba9876543210"), "entry of another program"),
        "cut short": (valid[: len(valid) // 2], "holds"),
        "cut in its seal": (valid[:30], "cut short"),
        "one byte of the program changed": (valid[:-1] + bytes([valid[-1] ^ 1]), "do not match its seal"),
        "an entry as JAX writes it (a deflate bomb here)": (zlib.compress(bytes(64 << 20)), "not a sealed"),
        "empty": (b"", "not a sealed"),
    }


HOSTILE: dict[str, Callable[[], dict[str, tuple[bytes, str]]]] = {
    "map": hostile_maps,
    "vocab": hostile_vocabs,
    "d2lzip": hostile_d2l_zips,
    "corpus": hostile_corpora,
    "state": hostile_states,
    "safetensors": hostile_safetensors,
    "hfconfig": hostile_hfconfigs,
    "hfflax": hostile_hf_flax,
    "hfh5": hostile_hf_h5,
    "kerashub": hostile_keras_hub,
    "kerasfile": hostile_keras_files,
    "kerasconfig": hostile_keras_hub_configs,
    "tf2data": hostile_tf2_data,
    "tf2index": hostile_tf2_indexes,
    "hfindex": hostile_shard_indexes,
    "tfindex": hostile_tf_indexes,
    "orbax": hostile_orbax_metadata,
    "deepspeed": hostile_deepspeed_latest,
    "pt2": hostile_exported_programs,
    "zippeddir": hostile_zipped_directories,
    "weights": hostile_weights,
    "npzarrays": hostile_named_arrays,
    "params": hostile_params,
    "flax": hostile_flax,
    "paddle": hostile_paddle,
    "paddlenlp": hostile_paddlenlp,
    "paddlenlp3": hostile_paddlenlp3,
    "paddlenlp2config": hostile_paddlenlp2_configs,
    "torch": hostile_torch,
    "inputs": hostile_inputs,
    "checkpoint": hostile_checkpoints,
    "reply": hostile_replies,
    "cache": hostile_cache_entries,
}


# --- Fuzzing -----------------------------------------------------------------------------------------------

EXTREMES = (0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 2**63 - 1, 2**64 - 1)


def mutate_bytes(data: bytes, rng: random.Random, corpus: list[bytes]) -> bytes:
    """One random byte-level change: flipped bits, an extreme integer, a cut, an insertion, a splice."""
    out = bytearray(data)
    choice = rng.randrange(7)
    if not out or choice == 0:  # insert random bytes
        at = rng.randint(0, len(out))
        out[at:at] = rng.randbytes(rng.randint(1, 16))
    elif choice == 1:  # flip bits
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif choice == 2:  # an extreme little-endian integer at an aligned offset
        width = rng.choice((2, 4, 8))
        at = rng.randrange(0, max(len(out) - width, 1), width) if len(out) > width else 0
        out[at : at + width] = (rng.choice(EXTREMES) & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
    elif choice == 3:  # truncate
        del out[rng.randrange(len(out)) :]
    elif choice == 4:  # delete a range
        at = rng.randrange(len(out))
        del out[at : at + rng.randint(1, 64)]
    elif choice == 5:  # duplicate a range
        at = rng.randrange(len(out))
        out[at:at] = out[at : at + rng.randint(1, 256)]
    else:  # splice with another file of the corpus
        other = rng.choice(corpus)
        cut = rng.randrange(len(out))
        out = out[:cut] + other[rng.randrange(len(other)) if other else 0 :]
    return bytes(out)


def mutate_inside_zip(data: bytes, rng: random.Random, corpus: list[bytes]) -> bytes:
    """Mutate one member's bytes and re-zip with correct CRCs, so the change reaches the member's parser."""
    members = zip_members(data)
    index = rng.randrange(len(members))
    name, payload = members[index]
    members[index] = (name, mutate_bytes(payload, rng, [p for _, p in members]))
    return make_zip(members)


JSON_VALUES = (0, -1, 1.5, 10**40, -(10**40), "x", "", None, True, [], {}, [1, 2], {"a": 1}, "float16", 2**63)


def mutate_manifest(data: bytes, rng: random.Random, corpus: list[bytes]) -> bytes:
    """Change one field of the manifest (config, dtype, digests, version) to a random JSON value."""

    def edit(manifest: dict) -> None:
        target, keys = (
            (manifest["config"], list(manifest["config"])) if rng.random() < 0.6 else (manifest, list(manifest))
        )
        key = rng.choice(keys)
        if rng.random() < 0.2:
            del target[key]
        else:
            target[key] = rng.choice(JSON_VALUES)

    return with_manifest(data, edit)


def mutate_npy_header(data: bytes, rng: random.Random, corpus: list[bytes]) -> bytes:
    """Give one tensor member a random (well-formed or not) .npy header over its own data."""
    members = zip_members(data)
    index = rng.randrange(len(members))
    name, payload = members[index]
    descr = rng.choice(("<f4", ">f4", "<f8", "<f2", "|u1", "<i8", "|O", "V8", "<c16", "|b1", "<U3", [("a", "<f4")]))
    shape = tuple(rng.choice((0, 1, 2, 3, 4, 11, 2**31, 2**62, -1)) for _ in range(rng.randint(0, 4)))
    header = npy_header(descr, shape, rng.random() < 0.2)
    members[index] = (name, npy_bytes(header, payload[128:], rng.choice(((1, 0), (2, 0), (3, 0)))))
    return make_zip(members)


SHAPES = (0, 1, 2, 3, 4, 6, 11, 2**31, 2**40, 2**62)


def mutate_a_shape(data: bytes, rng: random.Random, corpus: list[bytes]) -> bytes:
    """A Flax or Gluon file of CONFIG (whichever ``data`` is) with one tensor given a random shape of
    extreme sizes and no more bytes than it holds: what a file's own numbers claim, interpreted."""
    weights = random_weights(CONFIG)
    name = rng.choice(sorted(weights))
    shape = tuple(rng.choice(SHAPES) for _ in range(weights[name].ndim))
    if math.prod(shape) * 4 > 1 << 20:  # a shape the bytes cannot back: one axis of 0, as a file may claim
        shape = (0, *shape[1:])
    weights[name] = np.zeros(shape, np.float32)
    if data.startswith(MXNET_LIST_MAGIC):
        from bert_multi.backend import framework_names
        from bert_multi.files.formats.gluon import NAME_RULES

        names = framework_names(CONFIG, NAME_RULES)
        return params_bytes({names[key]: array for key, array in weights.items()})
    return flax_file_of(weights)


def mutate_exported_table(data: bytes, rng: random.Random, corpus: list[bytes]) -> bytes:
    """Change one field of one tensor's entry in an exported program's table of weights to a random value."""

    def edit(table: dict) -> None:
        entry = table[rng.choice(sorted(table))]
        target = entry["tensor_meta"] if rng.random() < 0.7 else entry
        key = rng.choice(sorted(target))
        if rng.random() < 0.2:
            del target[key]
        elif key in ("sizes", "strides") and rng.random() < 0.7:
            target[key] = [{"as_int": rng.choice(SHAPES)} for _ in range(rng.randint(0, 3))]
        else:
            target[key] = rng.choice([*JSON_VALUES, {"as_int": rng.choice(SHAPES)}])

    return with_exported_table(edit, data)


def fuzz_corpus(loader: str) -> tuple[list[bytes], list[Callable]]:
    """Valid files for ``loader`` and the mutations that suit them."""
    generic = [mutate_bytes, mutate_bytes]
    if loader == "map":
        return [json.dumps(MAP).encode(), json.dumps(MAP, indent=2).encode()], generic
    if loader == "vocab":
        return [vocab_bytes()], generic
    if loader == "d2lzip":
        return [d2l_zip_bytes()], [*generic, mutate_inside_zip]
    if loader == "corpus":
        return [corpus_bytes()], generic
    if loader == "state":
        return [state_bytes()], [*generic, mutate_inside_zip, mutate_manifest, mutate_npy_header]
    if loader == "tfindex":
        valid = (TF_CHECKPOINT / "bert_model.ckpt.index").read_bytes()
        classifier = (TF_CHECKPOINT.parent / "classifier" / "model.ckpt-2.index").read_bytes()
        return [valid, classifier], generic
    if loader == "hfindex":
        return [sharded_files()[SHARD_INDEX]], generic
    if loader in ("hfh5", "h5alone"):
        return [(HF_TF / "tf_model.h5").read_bytes()], generic
    if loader == "kerashub":
        return [(KERAS_HUB / "model.weights.h5").read_bytes()], generic
    if loader in ("tf2index", "tf2data"):
        part = "variables.index" if loader == "tf2index" else "variables.data-00000-of-00001"
        return [(TF2_SAVED / "variables" / part).read_bytes()], generic
    if loader == "kerasconfig":
        return [
            (KERAS_HUB / "config.json").read_bytes(),
            (KERAS_HUB.parent / "keras-hub-masked-lm" / "task.json").read_bytes(),
        ], generic
    if loader == "kerasfile":
        return [(KERAS_HUB.parent / "keras-hub-masked-lm.keras").read_bytes()], [*generic, mutate_inside_zip]
    if loader == "hfflax":
        untied = TF_CHECKPOINT.parent / "flax-untied-bfloat16" / "flax_model.msgpack"
        return [(HF_FLAX / "flax_model.msgpack").read_bytes(), untied.read_bytes()], generic
    if loader == "safetensorsfile":  # a d2l BERT's, and a transformers one's (its names read, then refused as no d2l)
        return [huggingface_files()["model.safetensors"], d2l_safetensors_bytes()], generic
    if loader in ("safetensors", "hfconfig"):
        return [huggingface_files()["model.safetensors" if loader == "safetensors" else "config.json"]], generic
    if loader == "weights":
        return [weights_bytes("float32"), weights_bytes("float64", 1)], [
            *generic,
            mutate_inside_zip,
            mutate_manifest,
            mutate_npy_header,
        ]
    if loader in ("params", "mxnet"):
        return [params_bytes(gluon_weights()), params_bytes(gluon_weights("float64", 1), V2_MAGIC)], generic
    if loader == "checkpoint":
        gluonnlp = [(TF_CHECKPOINT.parent / f"gluonnlp-{name}.params").read_bytes() for name in ("bert", "classifier")]
        paddle = (PADDLE_FIXTURES / "d2l-0.17.6-paddle.pdparams").read_bytes()
        transformers = torch_bytes(transformers_state())  # read as the original BERT: refused as not d2l's
        lightning = (TF_CHECKPOINT.parent / "lightning-d2l.ckpt").read_bytes()  # a dict: refused, naming its key
        corpus = [flax_bytes(), params_bytes(gluon_weights()), paddle, *gluonnlp, transformers, lightning]
        return [*corpus, state_bytes()], [  # a pretraining run's state: its weights read
            *generic,
            mutate_a_shape,
        ]
    if loader == "cache":
        return [cache_entry_bytes()], generic
    if loader == "npzarrays":
        return [named_arrays_bytes(), named_arrays_bytes(compressed=True)], [
            *generic,
            mutate_inside_zip,
            mutate_npy_header,
        ]
    if loader == "reply":
        return [reply_bytes()], [*generic, mutate_inside_zip, mutate_npy_header]
    if loader == "flax":
        return [flax_bytes(), flax_bytes("float64", 1, wrapped=True), FLAX_STATE.read_bytes()], generic
    if loader == "orbax":
        return [(ORBAX / "_METADATA").read_bytes()], generic
    if loader == "deepspeed":
        return [(DEEPSPEED / "latest").read_bytes()], generic
    if loader == "pt2":
        return [EXPORTED.read_bytes()], [*generic, mutate_inside_zip, mutate_exported_table]
    if loader == "zippeddir":
        return [google_zip_bytes()], [*generic, mutate_inside_zip]
    if loader == "paddlenlp":
        return [(PADDLENLP / "model_state.pdparams").read_bytes()], generic
    if loader == "paddlenlp2config":
        classifier = PADDLENLP2.parent / "paddlenlp2-classifier" / "model_config.json"
        return [(PADDLENLP2 / "model_config.json").read_bytes(), classifier.read_bytes()], generic
    if loader == "paddlenlp3":
        float32 = PADDLENLP3.parent / "paddlenlp3-safetensors" / "model.safetensors"
        return [(PADDLENLP3 / "model.safetensors").read_bytes(), float32.read_bytes()], generic
    if loader == "paddle":
        saved = [
            PADDLE_FIXTURES / name
            for name in ("d2l-0.17.6-paddle.pdparams", "protocol2.pdparams", "wrapped.pdparams", "paddle3.pdparams")
        ]
        return [*(path.read_bytes() for path in saved), pdparams_bytes(gluon_weights("float64", 1))], generic
    if loader == "torch":
        import torch

        state = torch_state()
        tied = {**state, "mlm.mlp.3.weight": state["encoder.token_embedding.weight"]}
        params = {name: torch.nn.Parameter(tensor) for name, tensor in torch_state("float64", 1).items()}
        legacy = torch_bytes(tied, _use_new_zipfile_serialization=False)
        return [torch_bytes(state), torch_bytes(tied), torch_bytes(params), legacy], [*generic, mutate_inside_zip]
    return [inputs_bytes(), inputs_bytes(compressed=True)], [*generic, mutate_inside_zip, mutate_npy_header]


def fuzz(loader: str, seconds: float, seed: int, out: Path) -> dict[str, object]:
    """Load mutated files for ``seconds``; every file that escapes is kept in ``out`` with its report.
    The file being loaded is always at ``out/current.bin``, so a crash or hang leaves its reproducer."""
    rng = random.Random(seed)
    corpus, mutations = fuzz_corpus(loader)
    out.mkdir(parents=True, exist_ok=True)
    current = out / "current.bin"
    outcomes = {"loaded": 0, "refused": 0, "escaped": 0}
    escapes = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        data = rng.choice(corpus)
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            try:
                data = rng.choice(mutations)(data, rng, corpus)
            except Exception:  # noqa: BLE001 - a structure-aware mutation needs a structure that is gone
                data = mutate_bytes(data, rng, corpus)
        current.write_bytes(data)
        result = probe(loader, str(current))
        outcomes[result["outcome"]] += 1
        if result["outcome"] == "escaped":
            kept = out / f"escape-{len(escapes)}.bin"
            kept.write_bytes(data)
            escapes.append({**result, "file": str(kept)})
    current.unlink()
    return {"loader": loader, "seed": seed, "seconds": seconds, "outcomes": outcomes, "escapes": escapes}


def fuzz_in_child(loader: str, seconds: float, seed: int, out: Path) -> dict[str, object]:
    """``fuzz`` in a child process under the memory cap; a crash or hang fails naming the file."""
    try:
        done = run_child(
            ["fuzz", loader, "--seconds", str(seconds), "--seed", str(seed), "--out", str(out)], seconds * 3 + 60
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the {loader} loader hung on {out / 'current.bin'}") from None
    if done.returncode != 0:
        raise AssertionError(
            f"the {loader} loader died (exit {done.returncode}) on {out / 'current.bin'}:\n{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    probing = sub.add_parser("probe", help="load files, print one JSON outcome per file")
    probing.add_argument("loader", choices=sorted(LOADERS))
    probing.add_argument("paths", nargs="+")
    fuzzing = sub.add_parser("fuzz", help="load mutated files for a while, report what escaped")
    fuzzing.add_argument("loader", choices=[*sorted(LOADERS), "all"])
    fuzzing.add_argument("--seconds", type=float, default=60.0, help="per loader (default 60)")
    fuzzing.add_argument("--seed", type=int, default=0)
    fuzzing.add_argument("--out", type=Path, default=Path("fuzz-out"), help="where escaping files are kept")
    args = parser.parse_args()
    _cap_memory()
    if args.command == "probe":
        for path in args.paths:
            print(json.dumps(probe(args.loader, path)), flush=True)
        return 0
    if args.loader != "all":
        print(json.dumps(fuzz(args.loader, args.seconds, args.seed, args.out)))
        return 0
    # `make fuzz`: every loader whose framework is installed, each in its own capped child.
    from bert_multi.backend.registry import not_in_process

    escaped = 0
    for loader in LOADERS:
        if loader in ("torch", "mxnet") and not_in_process(loader):
            print(f"{loader}: skipped ({not_in_process(loader)})")
            continue
        report = fuzz_in_child(loader, args.seconds, args.seed, args.out / loader)
        escaped += len(report["escapes"])
        print(
            f"{loader}: {report['outcomes']}"
            + "".join(f"\n  ESCAPED {e['type']}: {e['file']}" for e in report["escapes"])
        )
    return 1 if escaped else 0


if __name__ == "__main__":
    sys.exit(main())
