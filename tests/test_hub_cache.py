"""The HuggingFace hub's cache folder of a model (``models--org--name``, as ``from_pretrained`` leaves it):
read as the snapshot its ``refs/main`` names, the snapshot's files being links into ``blobs/``, as
huggingface_hub lays them out."""

import dataclasses
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from bert_multi import BERTConfig, WeightsError, inspect_checkpoint, load_checkpoint, random_weights, save_checkpoint
from bert_multi.spec.semantics import PRESETS

REVISION, OTHER = "a" * 40, "0123456789abcdef0123456789abcdef01234567"
CONFIG = BERTConfig(vocab_size=11, num_hiddens=8, ffn_num_hiddens=12, num_heads=2, num_blks=1, max_len=9)


def cache_folder(tmp_path, revisions=(REVISION,), ref=REVISION, seed=0):
    """A cache folder holding a small BERT at each of ``revisions`` (each its own numbers), ``refs/main``
    naming ``ref`` (none where ``ref`` is None)."""
    folder = tmp_path / "models--someone--tiny-bert"
    config = dataclasses.replace(CONFIG, semantics=PRESETS["bert"])
    for offset, revision in enumerate(revisions):
        written = tmp_path / f"written-{revision}"
        save_checkpoint(written, config, random_weights(config, seed=seed + offset), framework="huggingface")
        snapshot = folder / "snapshots" / revision
        snapshot.mkdir(parents=True)
        for file in written.iterdir():
            data = file.read_bytes()
            blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(exist_ok=True)
            blob.write_bytes(data)
            os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    if ref is not None:
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(ref)
    return folder


def test_the_snapshot_refs_main_names_is_read_and_said(tmp_path):
    folder = cache_folder(tmp_path, revisions=(OTHER, REVISION))
    checkpoint = load_checkpoint(folder)
    assert checkpoint.info.notes[:2] == [
        f"read the HuggingFace cache folder's snapshot {REVISION[:12]} (refs/main names it)",
        "read model.safetensors and config.json",
    ]
    named = load_checkpoint(folder / "snapshots" / REVISION)
    other = load_checkpoint(folder / "snapshots" / OTHER)
    token = "encoder.token_embedding.weight"
    assert np.array_equal(checkpoint.weights[token], named.weights[token])
    assert not np.array_equal(checkpoint.weights[token], other.weights[token])
    assert inspect_checkpoint(folder).format == "hf-dir"


def test_without_refs_main_the_only_snapshot_is_read(tmp_path):
    folder = cache_folder(tmp_path, ref=None)
    checkpoint = load_checkpoint(folder)
    assert checkpoint.info.notes[0] == f"read the HuggingFace cache folder's snapshot {REVISION[:12]} (the only one)"


def test_several_snapshots_and_no_refs_main_ask_which(tmp_path):
    folder = cache_folder(tmp_path, revisions=(OTHER, REVISION), ref=None)
    with pytest.raises(WeightsError, match=r"2 snapshots and no refs/main naming one: name the snapshot's directory"):
        load_checkpoint(folder)


def test_a_snapshot_of_only_the_config_says_the_weights_are_missing(tmp_path):
    folder = cache_folder(tmp_path)
    (folder / "snapshots" / REVISION / "model.safetensors").unlink()
    with pytest.raises(WeightsError, match=r"holds no config.json beside its weights .*from_pretrained downloads"):
        load_checkpoint(folder)


@pytest.mark.parametrize("ref", ["main", "a" * 39, "../../etc"])
def test_refs_main_must_be_a_commit_hash(tmp_path, ref):
    folder = cache_folder(tmp_path, ref=ref)
    with pytest.raises(WeightsError, match="expected a commit hash"):
        load_checkpoint(folder)


def test_a_snapshot_whose_blob_is_gone_names_the_file(tmp_path):
    folder = cache_folder(tmp_path)
    (folder / "snapshots" / REVISION / "model.safetensors").resolve().unlink()  # the link left dangling
    with pytest.raises(WeightsError, match=r"model.safetensors: no such safetensors file"):
        load_checkpoint(folder)


FIXTURES = Path(__file__).resolve().parent.parent / "conformance" / "original_bert" / "checkpoints"


@pytest.mark.parametrize(
    "fixture, kind",
    [("keras-hub-backbone", "keras-hub"), ("paddlenlp-pretraining", "paddlenlp-dir")],
    ids=["KerasHub's preset", "PaddleNLP's BERT"],
)
def test_a_snapshot_of_another_librarys_model_is_read_as_that_model(tmp_path, fixture, kind):
    """The hub holds other libraries' models too (KerasHub publishes its presets there): the snapshot is read
    as the directory it is, and the note says where it came from."""
    folder = tmp_path / f"models--someone--{fixture}"
    snapshot = folder / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    for file in (FIXTURES / fixture).iterdir():
        blob = folder / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.parent.mkdir(exist_ok=True)
        blob.write_bytes(file.read_bytes())
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(REVISION)
    checkpoint = load_checkpoint(folder)
    assert checkpoint.info.format == kind == inspect_checkpoint(snapshot).format
    assert checkpoint.info.notes[0].startswith(f"read the HuggingFace cache folder's snapshot {REVISION[:12]}")
    direct = load_checkpoint(FIXTURES / fixture)
    assert checkpoint.config == direct.config
    assert all(np.array_equal(checkpoint.weights[name], direct.weights[name]) for name in direct.weights)


def test_a_snapshot_that_is_itself_a_cache_folder_is_refused_not_followed(tmp_path):
    folder = cache_folder(tmp_path)
    snapshot = folder / "snapshots" / REVISION
    for name in os.listdir(snapshot):
        (snapshot / name).unlink()
    (snapshot / "snapshots").symlink_to(folder / "snapshots")  # a loop, were it followed
    (snapshot / "refs").symlink_to(folder / "refs")
    with pytest.raises(WeightsError, match="nor another library's model bert_multi reads"):
        load_checkpoint(folder)
