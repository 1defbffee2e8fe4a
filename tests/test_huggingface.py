"""The original BERT (``bert`` preset) against an independent implementation, HuggingFace transformers:
models built locally (never downloaded), saved in both of its file formats, imported, and computed by
every backend; and the importer's own parts (safetensors, attention masks, names)."""

import dataclasses
import json
import math
import re
import shutil
import struct

import numpy as np
import pytest

import bert_multi as bm
from bert_multi import InputError, WeightsError, backends
from bert_multi.engine.cases import CASES
from bert_multi.engine.compare import compare_arrays, tolerance_for
from bert_multi.errors import StatementsMissing
from bert_multi.files.formats.safetensors import read_safetensors, write_safetensors

AVAILABLE = [name for name, status in backends().items() if status.available]


def transformers_or_skip():
    return pytest.importorskip("transformers", reason="transformers is the independent reference (requirements.lock)")


# (id, BertConfig arguments, the class, how it is saved)
MODELS = [
    ("pretraining-erf-gelu", dict(hidden_size=12, num_attention_heads=3), "BertForPreTraining", "safetensors"),
    (
        "one-head-tanh-gelu",
        dict(hidden_size=7, num_attention_heads=1, hidden_act="gelu_pytorch_tanh"),
        "BertForPreTraining",
        "pytorch_model.bin",
    ),  # fmt: skip
    (
        "eight-heads-relu-untied",
        dict(hidden_size=16, num_attention_heads=8, hidden_act="relu", tie_word_embeddings=False),
        "BertForPreTraining",
        "safetensors",
    ),  # fmt: skip
    ("encoder-and-pooler", dict(hidden_size=10, num_attention_heads=2), "BertModel", "safetensors"),
    ("encoder-only", dict(hidden_size=6, num_attention_heads=2), "BertModel-no-pooler", "pytorch_model.bin"),
    # torch.save's legacy format (PyTorch < 1.6, as many pytorch_model.bin of 2019 and 2020), its decoder
    # sharing the word embeddings' storage.
    ("pretraining-legacy-bin", dict(hidden_size=8, num_attention_heads=2), "BertForPreTraining", "legacy"),
    # The classes of one pretraining head (BertForMaskedLM: what masked-LM fine-tuning saves).
    ("masked-lm", dict(hidden_size=8, num_attention_heads=4), "BertForMaskedLM", "safetensors"),
    ("next-sentence", dict(hidden_size=6, num_attention_heads=3), "BertForNextSentencePrediction", "safetensors"),
]
# The heads each class holds, as bert_multi names them.
CLASS_HEADS = {
    "BertForPreTraining": ("pooler", "mlm", "nsp"),
    "BertForMaskedLM": ("mlm",),
    "BertForNextSentencePrediction": ("pooler", "nsp"),
    "BertModel": ("pooler",),
}


def hf_model(spec, tmp_path):
    """A randomised transformers model in float64 (every tensor drawn, LayerNorms and biases too), saved."""
    transformers = transformers_or_skip()
    import torch

    name, arguments, kind, fmt = spec
    config = transformers.BertConfig(vocab_size=19, num_hidden_layers=2, intermediate_size=9,
                                     max_position_embeddings=11, **arguments)  # fmt: skip
    config._attn_implementation = "eager"
    if kind.startswith("BertModel"):
        model = transformers.BertModel(config, add_pooling_layer=kind == "BertModel")
    else:
        model = getattr(transformers, kind)(config)
    model = model.eval().double()
    generator = torch.Generator().manual_seed(sum(map(ord, name)))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64) * 0.5)
    directory = tmp_path / name
    model.save_pretrained(directory)
    if fmt in ("pytorch_model.bin", "legacy"):  # what transformers wrote before safetensors: torch.save's state_dict
        (directory / "model.safetensors").unlink()
        torch.save(model.state_dict(), directory / "pytorch_model.bin", _use_new_zipfile_serialization=fmt != "legacy")
    return model, directory


def hf_outputs(model, batch):
    """transformers' outputs on a batch, the valid_lens given as the attention mask they mean."""
    import torch

    T = batch["tokens"].shape[1]
    mask = (
        None if batch["valid_lens"] is None else (np.arange(T)[None, :] < batch["valid_lens"][:, None]).astype(np.int64)
    )
    inputs = {
        "input_ids": torch.from_numpy(batch["tokens"]),
        "attention_mask": None if mask is None else torch.from_numpy(mask),
        "token_type_ids": torch.from_numpy(batch["segments"]),
    }
    with torch.no_grad():
        out = model(**inputs)
        encoder = getattr(model, "bert", model)(**inputs)  # BertForPreTraining's own BertModel
    result = {"encoded": encoder.last_hidden_state.numpy()}
    if encoder.pooler_output is not None:
        result["pooler"] = encoder.pooler_output.numpy()
    # Each class names its heads' outputs its own way: both (BertForPreTraining), or one as ``logits``.
    kind = type(model).__name__
    vocabulary = out.prediction_logits if kind == "BertForPreTraining" else out.logits if "MaskedLM" in kind else None
    if vocabulary is not None and batch["pred_positions"] is not None:
        rows = np.arange(len(batch["pred_positions"]))[:, None]
        result["mlm"] = vocabulary.numpy()[rows, batch["pred_positions"]]
    if kind in ("BertForPreTraining", "BertForNextSentencePrediction"):
        result["nsp"] = (out.seq_relationship_logits if kind == "BertForPreTraining" else out.logits).numpy()
    return result


@pytest.mark.parametrize("spec", MODELS, ids=[m[0] for m in MODELS])
def test_every_backend_computes_what_transformers_computes(spec, tmp_path):
    if "torch" not in AVAILABLE:
        pytest.skip("transformers needs torch")
    model, directory = hf_model(spec, tmp_path)
    if spec[3] == "legacy":  # the format, not the zip one, is what this model tests
        from bert_multi.files.formats.torch_legacy import is_legacy

        assert is_legacy((directory / "pytorch_model.bin").read_bytes()[:8])
    checkpoint = bm.from_huggingface(directory)
    info = bm.inspect_checkpoint(directory)
    assert info.format == "hf-dir" and info.config == checkpoint.config
    assert checkpoint.config.heads == CLASS_HEADS.get(spec[2], ())
    assert checkpoint.config.semantics.mlm_decoder == ("own" if "untied" in spec[0] else "tied")
    built = {
        (backend, dtype): bm.load_backend(backend).build(checkpoint.config, checkpoint.weights, dtype=dtype)
        for backend in AVAILABLE
        for dtype in ("float64", "float32")
    }
    checked = 0
    for case in CASES:
        batch = case.batch(checkpoint.config, seed=3)
        if batch["valid_lens"] is not None and batch["valid_lens"].ndim == 2:
            continue  # a length per query has no attention_mask in transformers
        reference = hf_outputs(model, batch)
        for (backend, dtype), built_model in built.items():
            out = built_model(**batch, intermediates=True)
            got = {
                "encoded": out.encoded,
                "mlm": out.mlm,
                "nsp": out.nsp,
                "pooler": out.intermediates.get("pooler"),
            }
            for name, value in reference.items():
                comparison = compare_arrays(name, got[name], value, tolerance_for(dtype, "cpu"))
                assert comparison.passed, f"{case.name} {backend} {dtype}: {comparison.describe()}"
                checked += 1
            assert {k for k, v in got.items() if v is not None} == set(reference)  # nothing more, nothing less
    assert checked > 0


def test_a_round_trip_through_every_format_comes_back_to_transformers(tmp_path):
    transformers = transformers_or_skip()
    model, directory = hf_model(MODELS[0], tmp_path)
    route = [tmp_path / "a.npz", tmp_path / "a.pt"]
    if "mxnet" in AVAILABLE:
        route.append(tmp_path / "a.params")
    source = directory
    for target in route:
        bm.convert(source, target, num_heads=3, preset=bm.load_checkpoint(directory).config.semantics)
        source = target
    bm.convert(source, tmp_path / "back", framework="huggingface", num_heads=3, preset="bert")
    again = transformers.BertForPreTraining.from_pretrained(tmp_path / "back", attn_implementation="eager").eval()
    assert again.dtype.is_floating_point
    batch = CASES[0].batch(bm.load_checkpoint(directory).config, seed=3)
    before, after = hf_outputs(model, batch), hf_outputs(again.double(), batch)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])


# --- The importer's parts, without transformers --------------------------------------------------------


def test_safetensors_round_trip_and_hostile_headers(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4)}
    write_safetensors(tmp_path / "t.safetensors", arrays, {"format": "pt"})
    back, dtypes = read_safetensors(tmp_path / "t.safetensors")
    assert dtypes == {"a": "float32", "b": "float64"}
    assert all(back[n].tobytes() == arrays[n].tobytes() for n in arrays)
    data = (tmp_path / "t.safetensors").read_bytes()
    (header_size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_size])
    bad = {
        "header longer than the file": struct.pack("<Q", 2**40) + data[8:],
        "truncated": data[:-3],
        "offsets past the data": _with_header(header, data, "a", data_offsets=[0, 10**9]),
        "shape and offsets disagree": _with_header(header, data, "a", shape=[3, 3]),
        "unknown dtype": _with_header(header, data, "a", dtype="F8_E4M3"),
        "not JSON": struct.pack("<Q", 3) + b"{x}",
        # Round 3 (issue 26): each was another exception, a traceback or gigabytes before the refusal.
        "a dtype that is a list": _with_header(header, data, "a", dtype=["F32"]),
        "a dtype that is a dict": _with_header(header, data, "a", dtype={"F32": 1}),
        "33 axes": _with_header(header, data, "b", shape=[1] * 32 + [4], data_offsets=[24, 56]),
        "a shape of floats": _with_header(header, data, "a", shape=[2.0, 3]),
        "overlapping tensors": _with_header(header, data, "b", shape=[3], dtype="F64", data_offsets=[0, 24]),
        "a name twice": _header_text(data, f'{{"a": {json.dumps(header["a"])}, "a": {json.dumps(header["a"])}}}'),
    }
    for case, content in bad.items():
        (tmp_path / "bad.safetensors").write_bytes(content)
        with pytest.raises(WeightsError, match="not a readable safetensors file"):
            read_safetensors(tmp_path / "bad.safetensors")
        assert case


def _with_metadata(tmp_path, metadata):
    """A small HuggingFace directory whose model.safetensors' __metadata__ is ``metadata``, and its weights."""
    config = dataclasses.replace(bm.BERTConfig(11, 8, 12, 2, 1, max_len=9), semantics="bert")
    weights = bm.random_weights(config)
    bm.save_checkpoint(tmp_path / "hf", config, weights, framework="huggingface")
    path = tmp_path / "hf" / "model.safetensors"
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = {**json.loads(data[8 : 8 + size]), "__metadata__": metadata}
    path.write_bytes(_header_text(data, json.dumps(header)))
    return tmp_path / "hf", weights


@pytest.mark.parametrize("metadata", [{"format": 7}, []], ids=["a number", "a list"])
def test_safetensors_metadata_that_is_not_text_is_refused(tmp_path, metadata):
    directory, _ = _with_metadata(tmp_path, metadata)
    with pytest.raises(WeightsError, match=r"its __metadata__ is .*; expected an object of text"):
        bm.load_checkpoint(directory)


@pytest.mark.parametrize("label", ["tf", "flax", "mlx"])
def test_the_names_not_the_metadatas_label_decide_how_a_safetensors_file_reads(tmp_path, label):
    # PyTorch's names hold no kernel, scale or Keras scope: read as themselves whatever the label says.
    directory, weights = _with_metadata(tmp_path, {"format": label})
    loaded = bm.load_checkpoint(directory).weights
    assert all(np.array_equal(loaded[name], array) for name, array in weights.items())


def _header_text(data, text):
    """``data`` with its header replaced by ``text`` as written (JSON objects may repeat a name)."""
    (size,) = struct.unpack("<Q", data[:8])
    return struct.pack("<Q", len(text)) + text.encode() + data[8 + size :]


def test_a_header_of_many_tensors_is_refused_before_any_is_read(tmp_path, monkeypatch):
    """Counted, not timed: not one of its entries is looked at (a busy machine changes no count)."""
    from bert_multi.files.formats import safetensors as formats

    entries = {f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(200_000)}
    encoded = json.dumps(entries).encode()
    (tmp_path / "many.safetensors").write_bytes(struct.pack("<Q", len(encoded)) + encoded)
    looked_at = []
    entry = formats._entry
    monkeypatch.setattr(formats, "_entry", lambda *args: looked_at.append(args[0]) or entry(*args))
    with pytest.raises(WeightsError, match="200000 tensors; a BERT has hundreds"):
        read_safetensors(tmp_path / "many.safetensors")
    assert looked_at == []


def directory_with_config(tmp_path, **fields):
    """A small original BERT saved as a HuggingFace directory, its config.json given ``fields`` (as Python's json
    writes them: Infinity too)."""
    config = bm.BERTConfig(11, 4, 6, 2, 1, max_len=6, semantics="bert")
    bm.save_checkpoint(tmp_path / "hf", config, bm.random_weights(config), framework="huggingface")
    document = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**document, **fields}))
    return tmp_path / "hf"


@pytest.mark.parametrize(
    "field, value",
    [
        ("vocab_size", float("inf")),
        ("hidden_size", "4"),
        ("num_attention_heads", 1.5),
        ("num_attention_heads", True),
        ("num_hidden_layers", 10**6),
        ("max_position_embeddings", -1),
    ],
)
def test_sizes_in_config_json_are_whole_numbers_checked_against_the_weights(tmp_path, field, value):
    directory = directory_with_config(tmp_path, **{field: value})
    with pytest.raises(WeightsError, match=f"config.json: not a usable BERT config: {field} is") as caught:
        bm.load_checkpoint(directory)
    assert str(tmp_path / "hf") in str(caught.value)


@pytest.mark.parametrize("field, value", [("type_vocab_size", 2.0), ("is_decoder", 0), ("is_decoder", None)])
def test_a_switch_in_config_json_must_be_of_its_own_type(tmp_path, field, value):
    directory = directory_with_config(tmp_path, **{field: value})
    with pytest.raises(WeightsError, match=f"{field} is {value!r}; bert_multi computes BERT with {field} "):
        bm.load_checkpoint(directory)


@pytest.mark.parametrize(
    "kind, head, heads",
    [("BertForSequenceClassification", "classifier", ("pooler",)), ("BertForQuestionAnswering", "qa_outputs", ())],
)
def test_a_fine_tuned_berts_task_head_is_left_out_and_said(kind, head, heads, tmp_path):
    """A BERT fine-tuned with transformers' task classes is read as the BERT inside it, which computes what
    transformers' does; its task head is named in a note, never dropped unsaid."""
    if "torch" not in AVAILABLE:
        pytest.skip("transformers needs torch")
    model, directory = hf_model((kind, dict(hidden_size=8, num_attention_heads=2), kind, "safetensors"), tmp_path)
    checkpoint = bm.from_huggingface(directory)
    assert checkpoint.config.heads == heads
    (note,) = [note for note in checkpoint.info.notes if note.startswith("left out")]
    assert f"'{head}.bias', '{head}.weight'" in note and f"the task head of {kind!r}" in note
    batch = next(case for case in CASES if case.name == "mixed_valid_lens").batch(checkpoint.config, seed=3)
    reference = hf_outputs(model, batch)
    out = bm.load_backend("numpy").build(checkpoint.config, checkpoint.weights)(**batch, intermediates=True)
    got = {"encoded": out.encoded, "pooler": out.intermediates.get("pooler")}
    assert set(reference) == {"encoded", *heads}
    for name, value in reference.items():
        comparison = compare_arrays(name, got[name], value, tolerance_for("float64", "cpu"))
        assert comparison.passed, comparison.describe()


# A transformers model's state_dict saved alone (torch.save), as training scripts do: (id, its class, how it
# was wrapped when saved).
STATE_DICTS = [
    ("pretraining", "BertForPreTraining", ""),
    ("bare-model", "BertModel", ""),
    ("classifier", "BertForSequenceClassification", ""),
    ("data-parallel", "BertForPreTraining", "module."),
]


@pytest.mark.parametrize("name, kind, prefix", STATE_DICTS, ids=[spec[0] for spec in STATE_DICTS])
def test_a_transformers_state_dict_without_its_config_reads_once_its_heads_are_stated(tmp_path, name, kind, prefix):
    """The shapes say the sizes, never the heads: stated, the file computes what transformers does with its
    defaults (GELU's erf form, eps 1e-12), which a note says it assumed."""
    if "torch" not in AVAILABLE:
        pytest.skip("transformers needs torch")
    import torch

    model, _ = hf_model((name, dict(hidden_size=8, num_attention_heads=4), kind, "safetensors"), tmp_path)
    torch.save({prefix + key: value for key, value in model.state_dict().items()}, tmp_path / "bert.pt")
    with pytest.raises(StatementsMissing, match="state num_heads= to read it"):
        bm.load_checkpoint(tmp_path / "bert.pt")
    checkpoint = bm.load_checkpoint(tmp_path / "bert.pt", num_heads=4)
    assert any(note.startswith("left out") for note in checkpoint.info.notes) == (kind.endswith("Classification"))
    assert_computes_as_transformers(checkpoint, model, kind)


def assert_computes_as_transformers(checkpoint, model, kind: str) -> None:
    """A transformers model's state_dict read alone computes what the model computes, in float64, as said."""
    assert checkpoint.config.semantics.name == "bert"
    assert any(note.startswith("read as a transformers BERT's state_dict") for note in checkpoint.info.notes)
    batch = next(case for case in CASES if case.name == "mixed_valid_lens").batch(checkpoint.config, seed=3)
    reference = hf_outputs(model, batch)
    out = bm.load_backend("numpy").build(checkpoint.config, checkpoint.weights)(**batch, intermediates=True)
    got = {"encoded": out.encoded, "pooler": out.intermediates.get("pooler"), "mlm": out.mlm, "nsp": out.nsp}
    assert set(reference) == {"encoded", *checkpoint.config.heads} - ({"nsp"} if kind == "BertModel" else set())
    for output, value in reference.items():
        comparison = compare_arrays(output, got[output], value, tolerance_for("float64", "cpu"))
        assert comparison.passed, comparison.describe()


@pytest.mark.parametrize("writer", ["save_model", "save_pretrained", "save_file"])
def test_a_transformers_safetensors_file_alone_reads_as_its_state_dict(tmp_path, writer):
    """safetensors' own save_model (which keeps one name of each shared tensor), save_file of a state_dict
    cloned (save_file refuses tensors that share memory), and save_pretrained's model.safetensors taken out of
    its directory. Inside that directory, the file names the directory, whose config it has."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    if "torch" not in AVAILABLE:
        pytest.skip("transformers needs torch")
    spec = ("alone", dict(hidden_size=8, num_attention_heads=4), "BertForPreTraining", "safetensors")
    model, directory = hf_model(spec, tmp_path)
    path = tmp_path / "bert.safetensors"
    if writer == "save_model":
        safetensors_torch.save_model(model, str(path))
    elif writer == "save_file":
        # save_file refuses tensors that share memory: cloned, the tied decoder is saved twice, as equal numbers
        safetensors_torch.save_file({name: value.clone() for name, value in model.state_dict().items()}, str(path))
    else:
        shutil.copy(directory / "model.safetensors", path)
    with pytest.raises(WeightsError, match=f"in the directory of their config: name the directory, {directory}"):
        bm.load_checkpoint(directory / "model.safetensors", num_heads=4)
    if writer == "save_model":  # a file of the user's own beside a directory's files is not its weights
        shutil.copy(path, directory / "fine-tuned.safetensors")
        assert bm.load_checkpoint(directory / "fine-tuned.safetensors", num_heads=4).info.format == "safetensors"
        model.save_pretrained(tmp_path / "sharded", max_shard_size="4KB")
        shard = sorted((tmp_path / "sharded").glob("model-*-of-*.safetensors"))[0]
        with pytest.raises(WeightsError, match="in the directory of their config: name the directory"):
            bm.load_checkpoint(shard, num_heads=4)
    with pytest.raises(StatementsMissing, match="state num_heads= to read it"):
        bm.load_checkpoint(path)
    checkpoint = bm.load_checkpoint(path, num_heads=4)
    assert (checkpoint.info.format, checkpoint.info.framework) == ("safetensors", None)
    assert_computes_as_transformers(checkpoint, model, "BertForPreTraining")


@pytest.mark.parametrize("savez", ["savez", "savez_compressed"])
def test_a_transformers_state_dict_saved_by_numpy_reads_as_its_state_dict(tmp_path, savez):
    """np.savez of a state_dict's arrays (no bert_multi manifest), as weights are carried between frameworks:
    read by its names, as the state_dict is, and computing what transformers computes."""
    if "torch" not in AVAILABLE:
        pytest.skip("transformers needs torch")
    spec = ("numpy", dict(hidden_size=8, num_attention_heads=4), "BertForPreTraining", "safetensors")
    model, _ = hf_model(spec, tmp_path)
    getattr(np, savez)(tmp_path / "bert.npz", **{name: value.numpy() for name, value in model.state_dict().items()})
    with pytest.raises(StatementsMissing, match="state num_heads= to read it"):
        bm.load_checkpoint(tmp_path / "bert.npz")
    checkpoint = bm.load_checkpoint(tmp_path / "bert.npz", num_heads=4)
    assert (checkpoint.info.format, checkpoint.config.semantics.name) == ("npz-arrays", "bert")
    assert checkpoint.info.notes[0].startswith("read the .npz's arrays by their names, as a state_dict's")
    assert_computes_as_transformers(checkpoint, model, "BertForPreTraining")


def test_an_untied_or_unknown_transformers_state_dict_without_its_config_is_refused(tmp_path):
    """Only config.json says a decoder of its own is meant (tie_word_embeddings false); a layer BERT has not
    is never read past."""
    if "torch" not in AVAILABLE:
        pytest.skip("transformers needs torch")
    import torch

    spec = ("untied", dict(hidden_size=8, num_attention_heads=4, tie_word_embeddings=False), "BertForPreTraining", "")
    model, _ = hf_model(spec, tmp_path)
    torch.save(model.state_dict(), tmp_path / "bert.pt")
    with pytest.raises(WeightsError, match="MLM decoder is not its word embeddings.*name the directory holding"):
        bm.load_checkpoint(tmp_path / "bert.pt", num_heads=4)
    # A tensor of a layer BERT has not (transformers' relative positions) is named, not read past.
    state = {**model.state_dict(), "bert.encoder.layer.0.attention.self.distance_embedding.weight": torch.zeros(3, 2)}
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    torch.save(state, tmp_path / "relative.pt")
    with pytest.raises(WeightsError, match="tensors of no BERT layer bert_multi knows: .*distance_embedding"):
        bm.load_checkpoint(tmp_path / "relative.pt", num_heads=4)


# transformers' BERT-like models: (the class, its config's arguments beside the shared sizes, the name a
# message gives it). Their weights are named as a BERT's, or nearly, under another prefix; each computes
# another function, and none may be read as a BERT under a wrapper's prefix.
RELATIVE_MODELS = [
    ("roberta", "RobertaForMaskedLM", {}, "RoBERTa"),
    ("xlm-roberta", "XLMRobertaForMaskedLM", {}, "XLM-RoBERTa"),
    ("data2vec-text", "Data2VecTextForMaskedLM", {}, "data2vec-text"),
    ("distilbert", "DistilBertForMaskedLM", dict(dim=8, n_layers=1, n_heads=2, hidden_dim=6), "DistilBERT"),
    ("albert", "AlbertForPreTraining", dict(embedding_size=4), "ALBERT"),
    ("electra", "ElectraForPreTraining", dict(embedding_size=4), "ELECTRA"),
    ("ernie", "ErnieForPreTraining", dict(use_task_id=True), "ERNIE"),
    ("megatron-bert", "MegatronBertForPreTraining", {}, "MegatronBERT"),
    ("deberta-v2", "DebertaV2ForMaskedLM", {}, "DeBERTa-v2"),
    ("mpnet", "MPNetForMaskedLM", {}, "MPNet"),
]


@pytest.mark.parametrize(
    "model_type, architecture, arguments, name", RELATIVE_MODELS, ids=[m[0] for m in RELATIVE_MODELS]
)
def test_a_relative_of_bert_is_named_in_its_directory_alone_and_wrapped(
    tmp_path, model_type, architecture, arguments, name
):
    """A relative built by transformers is named for what it is: its directory by config.json's model_type, its
    state_dict alone and inside a Lightning checkpoint by its names, with no prefix suggested; a prefix stated,
    transformers' own (base_model_prefix), is refused too."""
    transformers = transformers_or_skip()
    import torch

    sizes = dict(vocab_size=19, max_position_embeddings=12)
    if model_type != "distilbert":
        sizes |= dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=6)
    model = getattr(transformers, architecture)(transformers.AutoConfig.for_model(model_type, **sizes, **arguments))
    model.save_pretrained(tmp_path / "hf")
    said = f"[^(]*{re.escape(name)}[^(]* \\(.*\\), which bert_multi does not read as BERT"
    with pytest.raises(WeightsError, match=f"model_type is {model.config.model_type!r}: {said}"):
        bm.load_checkpoint(tmp_path / "hf")
    said = "transformers' " + said
    torch.save(model.state_dict(), tmp_path / "alone.pt")
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}, tmp_path / "run.ckpt")
    for path, key, prefix in [
        ("alone.pt", None, None),
        ("alone.pt", None, model.base_model_prefix),
        ("run.ckpt", None, None),
        ("run.ckpt", "state_dict", f"model.{model.base_model_prefix}."),
    ]:
        with pytest.raises(WeightsError, match=said) as caught:
            bm.inspect_checkpoint(tmp_path / path, key=key, prefix=prefix)
        assert "prefix=" not in str(caught.value), caught.value


def test_the_relatives_table_agrees_with_transformers_on_each_models_prefix():
    """Each relative's prefix is the one transformers' model of that model_type puts before its encoder."""
    transformers = transformers_or_skip()
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    from bert_multi.files.formats.transformers_names import RELATIVES

    prefixes = {
        model_type: getattr(transformers, MODEL_MAPPING_NAMES[model_type]).base_model_prefix for model_type in RELATIVES
    }
    assert prefixes == {model_type: relative.prefix for model_type, relative in RELATIVES.items()}


def test_a_roberta_base_model_alone_is_refused_by_its_one_segment(tmp_path):
    """RoBERTa's base model has BERT's very names; its releases' one segment (type_vocab_size 1) is what tells
    them apart, where no config.json is beside the file."""
    transformers = transformers_or_skip()
    import torch

    config = transformers.RobertaConfig(vocab_size=19, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=6, max_position_embeddings=14, type_vocab_size=1)  # fmt: skip
    torch.save(transformers.RobertaModel(config).state_dict(), tmp_path / "roberta.pt")
    with pytest.raises(WeightsError, match="segment embedding.* has 1 row; a BERT's has 2.*transformers' RoBERTa"):
        bm.inspect_checkpoint(tmp_path / "roberta.pt")


@pytest.mark.parametrize(
    "field", ["model_type", "hidden_act", "position_embedding_type", "hidden_dropout_prob", "layer_norm_eps"]
)
def test_a_huge_value_in_config_json_is_shown_cut_short(tmp_path, field):
    directory = directory_with_config(tmp_path, **{field: "x" * 100_000})
    with pytest.raises(WeightsError, match=f"{field} (is )?'xxx") as caught:
        bm.load_checkpoint(directory)
    assert len(str(caught.value)) < 300 + len(str(tmp_path))


@pytest.mark.parametrize("twin", ["gamma", "prefix"])
def test_two_names_for_one_tensor_in_a_huggingface_directory_are_refused(tmp_path, twin):
    """A TensorFlow-era gamma beside its weight, or a tensor with and without "bert.": never one of them
    taken silently."""
    from bert_multi.files.formats.safetensors import write_safetensors

    config = bm.BERTConfig(11, 4, 6, 2, 1, max_len=6, semantics="bert")
    bm.save_checkpoint(tmp_path / "hf", config, bm.random_weights(config), framework="huggingface")
    tensors, _ = read_safetensors(tmp_path / "hf" / "model.safetensors")
    name = next(n for n in tensors if n.endswith("attention.output.LayerNorm.weight"))
    twin_name = name.replace(".weight", ".gamma") if twin == "gamma" else name.removeprefix("bert.")
    if twin_name == name:
        twin_name = "bert." + name
    write_safetensors(tmp_path / "hf" / "model.safetensors", {**tensors, twin_name: tensors[name] + 1}, {})
    with pytest.raises(WeightsError, match="are both encoder.blks.0.addnorm1.ln.weight"):
        bm.load_checkpoint(tmp_path / "hf")


def _with_header(header, data, name, **changes):
    (size,) = struct.unpack("<Q", data[:8])
    changed = {**header, name: {**header[name], **changes}}
    encoded = json.dumps(changed).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data[8 + size :]


def test_bfloat16_in_safetensors_is_read_exactly_and_cast_only_when_asked(tmp_path):
    values = np.array([1.0, -2.5, 3.140625], dtype=np.float32)  # exact in bfloat16
    raw = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    header = json.dumps({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}).encode()
    (tmp_path / "bf.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + raw)
    arrays, dtypes = read_safetensors(tmp_path / "bf.safetensors")
    assert dtypes == {"w": "bfloat16"} and arrays["w"].tolist() == values.tolist()


def test_attention_masks_become_valid_lens_when_a_length_can_say_them():
    assert bm.valid_lens_from_attention_mask(np.array([[1, 1, 0], [1, 1, 1], [0, 0, 0]])).tolist() == [2, 3, 0]
    for mask, why in (([[0, 1, 1]], "row 0 is \\[0, 1, 1\\]: valid_lens express right padding only"),
                      ([[1, 1], [1, 0], [1, 0], [0, 1]], "row 3"),
                      ([[1, 2]], "only 0 and 1"),
                      ([1, 1], "shape \\(B, T\\)")):  # fmt: skip
        with pytest.raises(InputError, match=why):
            bm.valid_lens_from_attention_mask(np.array(mask))


def test_the_bert_preset_by_hand_embedding_layernorm_and_tied_decoder():
    """Two features: LayerNorm maps a pair (a, b) to +-(a - b)/2 / sqrt(((a - b)/2)^2 + eps), times gamma plus
    beta; the MLM logits are the transformed vector times E^T plus the decoder's own bias."""
    config = bm.BERTConfig(5, 2, 3, 1, 1, max_len=4, semantics="bert")
    weights = bm.random_weights(config, seed=7, dtype="float64")
    tokens, segments = np.array([[1, 4, 2]]), np.array([[0, 1, 1]])
    out = bm.load_backend("numpy").build(config, weights)(
        tokens, segments, pred_positions=np.array([[2]]), intermediates=True
    )
    summed = (weights["encoder.token_embedding.weight"][tokens] + weights["encoder.segment_embedding.weight"][segments]
              + weights["encoder.pos_embedding"][:, :3])  # fmt: skip
    half_gap = (summed[..., 0] - summed[..., 1])[..., None] / 2 * np.array([1.0, -1.0])  # x - mean
    normed = half_gap / np.sqrt(half_gap[..., :1] ** 2 + 1e-12)  # the variance of the pair is half_gap^2
    by_hand = normed * weights["encoder.embedding_norm.weight"] + weights["encoder.embedding_norm.bias"]
    np.testing.assert_allclose(out.intermediates["embedding"], by_hand, rtol=0, atol=1e-12)
    x = out.encoded[0, 2] @ weights["mlm.mlp.0.weight"].T + weights["mlm.mlp.0.bias"]
    gelu = np.array([0.5 * v * (1 + math.erf(v / 2**0.5)) for v in x])
    centred = gelu - gelu.mean()
    normed = centred / np.sqrt(centred.var() + 1e-12) * weights["mlm.mlp.2.weight"] + weights["mlm.mlp.2.bias"]
    logits = weights["encoder.token_embedding.weight"] @ normed + weights["mlm.mlp.3.bias"]
    np.testing.assert_allclose(out.mlm[0, 0], logits, rtol=0, atol=1e-12)
    assert "mlm.mlp.3.weight" not in weights  # tied: the decoder has no weight of its own


def test_a_d2l_model_cannot_pass_for_a_huggingface_one(tmp_path):
    config = bm.BERTConfig(5, 2, 3, 1, 1, max_len=4)
    with pytest.raises(ValueError, match="cannot express"):
        bm.save_checkpoint(tmp_path / "hf", config, bm.random_weights(config), framework="huggingface")
    other = dataclasses.replace(config, semantics="bert", heads=("pooler", "mlm"))
    with pytest.raises(ValueError, match="no BERT class with exactly the heads"):
        bm.save_checkpoint(tmp_path / "hf", other, bm.random_weights(other), framework="huggingface")


def test_transformers_is_one_more_row_of_a_conformance_report(tmp_path, capsys):
    transformers_or_skip()
    from bert_multi.cli import main

    argv = ["conform", "--config", "tiny", "--backends", "torch", "--reference", "transformers", "--cases",
            "mixed_valid_lens,valid_lens_2d,valid_len_zero,edge_pred_positions"]  # fmt: skip
    assert main([*argv, "--preset", "bert", "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {(check["target"], check["reference"]) for check in report["checks"]}
    assert ("transformers float32 cpu", "oracle") in rows and ("transformers float64 cpu", "oracle") in rows
    assert any(target.startswith("torch") and "transformers" in reference for target, reference in rows)
    for dtype in ("float32", "float64"):  # it computes with TF32 off, and says so
        assert report["runtime"][f"transformers {dtype} cpu"]["matmul precision"] == dtype
    capsys.readouterr()
    assert main([*argv, "--preset", "d2l"]) == 0  # transformers cannot compute d2l's BERT: a SKIP row, not a failure
    assert "SKIP" in capsys.readouterr().out


def test_a_huggingface_directory_is_a_checkpoint_like_any_other(tmp_path, capsys):
    from bert_multi.cli import main

    config = bm.BERTConfig(11, 4, 6, 2, 1, max_len=6, semantics="bert")
    bm.save_checkpoint(tmp_path / "hf", config, bm.random_weights(config), framework="huggingface")
    assert main(["inspect", str(tmp_path / "hf")]) == 0
    assert "HuggingFace BERT directory" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "hf"), "--backends", "numpy", "--no-pairs"]) == 0
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "w.npz")]) == 0
    # The directory records no dropout (the config's was none): read as transformers' default, 0.1.
    assert bm.load_weights(tmp_path / "w.npz")[0] == dataclasses.replace(config, dropout=0.1)
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "w.npz"), str(tmp_path / "back"), "--framework", "huggingface"]) == 0
    assert f"wrote {tmp_path / 'back'}: HuggingFace BERT directory" in capsys.readouterr().out
    (tmp_path / "made-first").mkdir()  # a directory that exists already is written into, as save_pretrained does
    assert main(["convert", str(tmp_path / "w.npz"), str(tmp_path / "made-first"), "--framework", "huggingface"]) == 0
    assert bm.load_checkpoint(tmp_path / "made-first").config == bm.load_checkpoint(tmp_path / "back").config


def test_a_huggingface_directory_converted_to_itself_keeps_its_config_json(tmp_path, capsys):
    """Every field bert_multi does not compute (dropout, pad_token_id, initializer_range, transformers'
    own) is written again unchanged and in its place: config.json comes back byte for byte."""
    transformers = transformers_or_skip()
    from bert_multi.cli import main

    settings = dict(hidden_dropout_prob=0.15, attention_probs_dropout_prob=0.05, pad_token_id=3, initializer_range=0.5)
    config = transformers.BertConfig(vocab_size=19, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=9, max_position_embeddings=11, **settings)  # fmt: skip
    transformers.BertForPreTraining(config).save_pretrained(tmp_path / "my-bert")
    source = (tmp_path / "my-bert" / "config.json").read_text()
    assert main(["convert", str(tmp_path / "my-bert"), str(tmp_path / "copy"), "--framework", "huggingface"]) == 0
    assert (tmp_path / "copy" / "config.json").read_text() == source
    said = capsys.readouterr().out
    assert "config.json: kept the source's " in said and "hidden_dropout_prob" in said and "pad_token_id" in said
    again = transformers.BertConfig.from_pretrained(tmp_path / "copy")
    assert {name: getattr(again, name) for name in settings} == settings
    # A directory of transformers before 4.56 names the dtype torch_dtype: written as dtype, and said.
    older = json.loads(source)
    older["torch_dtype"] = older.pop("dtype")
    (tmp_path / "my-bert" / "config.json").write_text(json.dumps(older))
    assert main(["convert", str(tmp_path / "my-bert"), str(tmp_path / "copy2"), "--framework", "huggingface"]) == 0
    assert json.loads((tmp_path / "copy2" / "config.json").read_text()) == json.loads(source)
    assert "torch_dtype written as dtype" in capsys.readouterr().out


def test_a_model_whose_file_records_no_dropout_leaves_it_to_transformers_and_says_so(tmp_path, capsys):
    transformers = transformers_or_skip()
    from bert_multi.cli import main

    config = bm.BERTConfig(11, 4, 6, 2, 1, max_len=6, semantics="bert")
    bm.save_weights(tmp_path / "w.npz", config, bm.random_weights(config))
    assert main(["convert", str(tmp_path / "w.npz"), str(tmp_path / "hf"), "--framework", "huggingface"]) == 0
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert "hidden_dropout_prob" not in written and "attention_probs_dropout_prob" not in written
    assert "transformers trains it with its default, 0.1" in capsys.readouterr().out
    assert transformers.BertConfig.from_pretrained(tmp_path / "hf").hidden_dropout_prob == 0.1
    stated = dataclasses.replace(config, dropout=0.2)  # a config that states its dropout has it written
    bm.save_checkpoint(tmp_path / "hf2", stated, bm.random_weights(stated), framework="huggingface")
    written = json.loads((tmp_path / "hf2" / "config.json").read_text())
    assert written["hidden_dropout_prob"] == written["attention_probs_dropout_prob"] == 0.2


def test_transformers_fused_attention_and_bfloat16_products_are_variants_of_the_same_model():
    """bench times transformers' sdpa attention and bfloat16 autocast beside its eager float32 model: sdpa
    computes the oracle's numbers to the policy in both dtypes (every case, masks included), and bfloat16
    products stay within 1e-2-level error and say so."""
    transformers_or_skip()
    config = bm.CONFIGS["tiny"].with_semantics("bert")
    weights = bm.random_weights(config, seed=5, dtype="float64")
    backend = bm.load_backend("transformers")
    cases = [case.input(config) for case in CASES]
    sdpa = bm.register_backend(SdpaTransformers(), role="reference")
    try:
        targets = [bm.Target(sdpa.name, dtype) for dtype in ("float32", "float64")]
        report = bm.run_conformance(config, weights, targets, cases, False)
    finally:
        bm.unregister_backend(sdpa.name)
    assert report.passed and len(report.checks) == 2 * len(cases), report.failures()
    assert {info["attention"] for info in report.runtime.values()} == {"sdpa"}
    batch = CASES[0].batch(config)
    oracle = bm.load_backend("numpy").build(config, weights)(**batch)
    model = backend.build(config, weights, mixed_precision="bfloat16")
    error = float(np.abs(model(**batch).encoded - oracle.encoded).max())
    assert 1e-4 < error < 0.25 and model.runtime_info()["matmul precision"] == "bfloat16"
    with pytest.raises(ValueError, match=r"unknown attention 'flash': transformers' BERT offers \['eager', 'sdpa'\]"):
        backend.build(config, weights, attention="flash")


class SdpaTransformers:
    """transformers with its fused attention, as a backend of its own for one conformance run."""

    NAME = "transformers-sdpa"

    def supports(self, config, device="cpu"):
        return bm.load_backend("transformers").supports(config, device)

    def build(self, config, weights, device="cpu", dtype="float32", gradients=True, share=False):
        return bm.load_backend("transformers").build(config, weights, device, dtype, gradients=False, attention="sdpa")


def test_bench_times_transformers_fused_attention_beside_its_eager_model():
    """Its BENCH_VARIANTS reach bench through the registry: a forward row for eager attention and one for
    sdpa, the same workload, both timed (and the eager model's NumPy round trip beside it)."""
    transformers_or_skip()
    from bert_multi.tools.bench import workloads

    timed = workloads("cpu", ["tiny"], ["float32"], rounds=1, train=False, only=["transformers"])
    rows = [row for _, workload in timed for row in workload()]
    assert sorted(row.backend for row in rows) == [
        "transformers",
        "transformers (NumPy round trip)",
        "transformers sdpa",
    ]
    assert all(len(row.seconds) == 1 and row.tokens == 4 * 16 for row in rows)


def test_transformers_states_the_tf32_it_was_built_with():
    """tf32 is a standard build option of transformers too (bench's TF32 rows); a CPU computes float32
    products in full whatever it says."""
    transformers_or_skip()
    config = bm.CONFIGS["tiny"].with_semantics("bert")
    weights = bm.random_weights(config, seed=1)
    backend = bm.load_backend("transformers")
    assert backend.takes("tf32")
    for tf32 in (False, True):
        info = backend.build(config, weights, tf32=tf32, gradients=False).runtime_info()
        assert (info["tf32"], info["matmul precision"]) == (tf32, "float32")


# --- Checkpoints saved in shards -----------------------------------------------------------------------------


def _sharded(tmp_path, max_shard_size="4KB"):
    """A BertForPreTraining transformers itself saves in shards, and the same model saved whole."""
    transformers = transformers_or_skip()
    config = transformers.BertConfig(vocab_size=19, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=12, max_position_embeddings=11)  # fmt: skip
    model = transformers.BertForPreTraining(config)
    model.save_pretrained(tmp_path / "sharded", max_shard_size=max_shard_size)
    model.save_pretrained(tmp_path / "whole")
    return tmp_path / "sharded", tmp_path / "whole"


def test_a_checkpoint_transformers_saved_in_shards_reads_as_the_whole_one(tmp_path):
    sharded, whole = _sharded(tmp_path)
    assert len(list(sharded.glob("model-*-of-*.safetensors"))) > 1 and not (sharded / "model.safetensors").exists()
    checkpoint = bm.load_checkpoint(sharded)
    assert checkpoint.info.notes[0] == "read the shards model.safetensors.index.json names and config.json"
    same = bm.load_checkpoint(whole)
    assert checkpoint.config == same.config and checkpoint.weights.keys() == same.weights.keys()
    assert all(np.array_equal(array, same.weights[name]) for name, array in checkpoint.weights.items())


def test_pytorch_model_bin_in_shards_reads_too(tmp_path):
    """transformers 5 writes no .bin shards; transformers 4 did (its index has the same form)."""
    import torch

    sharded, whole = _sharded(tmp_path)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    for shard in set(index["weight_map"].values()):
        tensors, _ = read_safetensors(sharded / shard)
        name = shard.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
        torch.save({key: torch.from_numpy(array) for key, array in tensors.items()}, sharded / name)
        (sharded / shard).unlink()
    weight_map = {key: value.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
                  for key, value in index["weight_map"].items()}  # fmt: skip
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps({**index, "weight_map": weight_map}))
    (sharded / "model.safetensors.index.json").unlink()
    loaded, same = bm.load_checkpoint(sharded).weights, bm.load_checkpoint(whole).weights
    assert loaded.keys() == same.keys() and all(np.array_equal(loaded[name], same[name]) for name in same)


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda index: {**index, "weight_map": {**index["weight_map"], "extra.weight": "../model.safetensors"}},
         r"a shard is named '../model.safetensors', which is not a file name of its directory"),
        (lambda index: {**index, "weight_map": {**index["weight_map"], "extra.weight": next(iter(
            index["weight_map"].values()))}}, r"its weight_map names \['extra.weight'\], which no shard holds"),
        (lambda index: {**index, "weight_map": dict(list(index["weight_map"].items())[1:])},
         r"holds \['.*'\], which its weight_map places elsewhere or nowhere"),
        (lambda index: [], r"not a JSON object"),
    ],
    ids=["a path outside", "a tensor no shard holds", "a tensor the map leaves out", "a list"],
)  # fmt: skip
def test_a_shard_index_that_disagrees_with_its_shards_is_refused(tmp_path, change, error):
    sharded, _ = _sharded(tmp_path)
    path = sharded / "model.safetensors.index.json"
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    with pytest.raises(WeightsError, match=error):
        bm.load_checkpoint(sharded)
