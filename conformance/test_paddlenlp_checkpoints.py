"""BERTs saved by PaddleNLP (``conformance/original_bert/paddlenlp_bert.py`` wrote them with PaddleNLP 2.8 on
PaddlePaddle 2.6, and the same weights again with PaddleNLP 3 on Paddle 3); this suite only reads them,
without Paddle. Each is held to what PaddleNLP itself computed from it, in float64 and float32, and converts
to a directory transformers loads."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bert_multi as bm
from bert_multi import WeightsError, convert, inspect_checkpoint, load_backend, load_checkpoint
from bert_multi.files.formats.paddle import read_pdparams
from bert_multi.files.formats.safetensors import read_metadata, read_safetensors, write_safetensors
from bert_multi.spec.semantics import PRESETS
from conftest import encoder_outputs, pretraining_outputs, runs_here, saved_mismatches

HERE = Path(__file__).parent / "original_bert" / "checkpoints"
PRETRAINING = HERE / "paddlenlp-pretraining"
with np.load(HERE / "paddlenlp.npz", allow_pickle=False) as archive:
    SAVED = {name: archive[name] for name in archive.files}
INPUTS = {name.removeprefix("inputs/"): array for name, array in SAVED.items() if name.startswith("inputs/")}


def outputs(config, weights) -> dict[str, np.ndarray]:
    """The oracle's float64 outputs at INPUTS: the encoding and pooled output, the MLM and NSP logits."""
    found = encoder_outputs(config, weights, INPUTS)
    model = load_backend("numpy").build(config, {n: a.astype(np.float64) for n, a in weights.items()}, dtype="float64")
    out = model(**INPUTS)
    return {**found, "mlm": out.mlm, "nsp": out.nsp}


def mismatches(computed: dict[str, np.ndarray], dtype: str) -> list[str]:
    """What of ``computed`` differs from PaddleNLP's outputs in ``dtype`` beyond that dtype's tolerance."""
    saved = sorted(name for name in SAVED if name.startswith(f"{dtype}/"))
    assert saved == [f"{dtype}/{name}" for name in ("encoded", "mlm", "nsp", "pooled")], "not all outputs saved"
    return saved_mismatches(SAVED, computed, dtype, dtype)


def test_a_paddlenlp_bert_computes_what_paddlenlp_computes_in_float64_and_float32():
    checkpoint = load_checkpoint(PRETRAINING)
    config = checkpoint.config
    assert (config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_blks) == (13, 8, 12, 2)
    assert (config.num_heads, config.max_len, config.heads) == (2, 16, ("pooler", "mlm", "nsp"))
    semantics = config.semantics
    assert (semantics.activation, semantics.layer_norm_eps, semantics.mlm_decoder) == ("gelu", 1e-12, "tied")
    assert checkpoint.info.notes[0].startswith("read model_state.pdparams and config.json (PaddleNLP's BERT")
    computed = outputs(config, checkpoint.weights)
    assert mismatches(computed, "float64") == []
    assert mismatches(computed, "float32") == []


@pytest.mark.parametrize(
    "change", [{"activation": "gelu_tanh"}, {"layer_norm_eps": 1e-5}], ids=["tanh GELU", "Paddle's default eps"]
)
def test_paddlenlps_float64_outputs_tell_each_difference_of_semantics(change):
    """What keeps the first test from passing on the wrong model: PaddleNLP's float64 outputs tell GELU's
    forms apart, and its LayerNorm eps (config.json's, which PaddleNLP sets on every LayerNorm) from
    Paddle's default 1e-5."""
    checkpoint = load_checkpoint(PRETRAINING)
    semantics = dataclasses.replace(checkpoint.config.semantics, **change)
    computed = outputs(dataclasses.replace(checkpoint.config, semantics=semantics), checkpoint.weights)
    assert mismatches(computed, "float64") != []


def test_the_attention_weights_are_transposed_from_paddles_layout():
    """q_proj is square, so only the file's origin says it is (in, out): its transpose is the weight."""
    raw, _, _ = read_pdparams(PRETRAINING / "model_state.pdparams")
    kernel = raw["bert.encoder.layers.0.self_attn.q_proj.weight"]
    assert kernel.shape == (8, 8) and not np.array_equal(kernel, kernel.T)
    weights = load_checkpoint(PRETRAINING).weights
    assert np.array_equal(weights["encoder.blks.0.attention.W_q.weight"], kernel.T)
    assert np.array_equal(weights["mlm.mlp.3.bias"], raw["cls.predictions.decoder_bias"])  # saved twice, read once
    assert "mlm.mlp.3.weight" not in weights  # tied: the word embeddings, saved again as the decoder's


@pytest.mark.parametrize(
    "name, heads, note",
    [("paddlenlp-model", ("pooler",), None), ("paddlenlp-classifier", ("pooler",), "'BertForSequenceClassification'")],
)
def test_a_bare_model_and_a_fine_tuned_classifier_read_as_their_encoders(name, heads, note):
    info = inspect_checkpoint(HERE / name)
    assert (info.format, info.framework, info.heads) == ("paddlenlp-dir", None, heads)
    left_out = [n for n in info.notes if n.startswith("left out")]
    assert left_out == ([] if note is None else [left_out[0]]) and (note is None or note in left_out[0])
    raw, _, _ = read_pdparams(HERE / name / "model_state.pdparams")
    prefix = "" if name == "paddlenlp-model" else "bert."
    weights = load_checkpoint(HERE / name).weights
    assert np.array_equal(weights["encoder.token_embedding.weight"], raw[f"{prefix}embeddings.word_embeddings.weight"])
    assert np.array_equal(weights["hidden.0.weight"], raw[f"{prefix}pooler.dense.weight"].T)


@runs_here("transformers")
@pytest.mark.parametrize(
    "source",
    ["paddlenlp-pretraining", "paddlenlp2-pretraining", "paddlenlp2-cache/bert-toy"],
    ids=["2.8", "2.3", "cache"],
)
def test_a_paddlenlp_bert_converts_to_a_directory_transformers_loads(tmp_path, source):
    import torch
    import transformers

    convert(HERE / source, tmp_path / "hf", framework="huggingface")
    model = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").double().eval()
    computed = pretraining_outputs(model, INPUTS)
    with torch.no_grad():
        computed["pooled"] = model.bert.pooler(torch.from_numpy(computed["encoded"])).numpy()
    assert mismatches(computed, "float64") == []


# PaddleNLP 2.3's save_pretrained: model_config.json, the arguments each model was built with (2.0 to 2.4.2).
PADDLENLP2 = HERE / "paddlenlp2-pretraining"


def test_paddlenlp_2s_model_config_reads_as_the_model_paddlenlp_2_8_saved():
    """PaddleNLP 2.3 built paddlenlp-pretraining/'s model with keywords, loaded its weights and saved them: the
    same model, its config and weights, so it computes what PaddleNLP computes (2.3 itself did, the generator
    checked, to the last bit in float64)."""
    old, new = load_checkpoint(PADDLENLP2), load_checkpoint(PRETRAINING)
    assert (old.config, old.info.settings) == (new.config, new.info.settings)
    assert old.weights.keys() == new.weights.keys()
    assert all(np.array_equal(old.weights[name], new.weights[name]) for name in new.weights)
    assert old.info.notes[0].startswith("read model_state.pdparams and model_config.json (PaddleNLP's BERT")
    assert "model_config.json leaves out the BertModel's hidden_act='gelu'" in old.info.notes[1]
    computed = outputs(old.config, old.weights)
    assert mismatches(computed, "float64") == []
    assert mismatches(computed, "float32") == []


def test_paddlenlp_2s_arguments_by_position_are_named_in_its_bert_models_order():
    """The classifier's BertModel was built as BertModel(13, 8, 1, 4, 12, ...): one block of four heads."""
    checkpoint = load_checkpoint(HERE / "paddlenlp2-classifier")
    config = checkpoint.config
    assert (config.vocab_size, config.num_hiddens, config.num_blks, config.num_heads) == (13, 8, 1, 4)
    assert (config.ffn_num_hiddens, config.max_len, config.heads) == (12, 16, ("pooler",))
    assert (config.semantics.activation, config.semantics.layer_norm_eps) == ("gelu", 1e-12)
    assert any("'BertForSequenceClassification'" in note for note in checkpoint.info.notes if note.startswith("left"))
    raw, _, _ = read_pdparams(HERE / "paddlenlp2-classifier" / "model_state.pdparams")
    q_proj = raw["bert.encoder.layers.0.self_attn.q_proj.weight"]
    assert np.array_equal(checkpoint.weights["encoder.blks.0.attention.W_q.weight"], q_proj.T)


def test_paddlenlp_2s_defaults_are_its_own():
    """A BertModel built without type_vocab_size has PaddleNLP 2's 16 token types, not transformers' 2."""
    with pytest.raises(WeightsError, match="model_config.json: not a usable BERT config: type_vocab_size is 16"):
        load_checkpoint(HERE / "paddlenlp2-model")


def test_paddlenlp_2s_download_cache_reads_as_the_model_it_holds(tmp_path):
    """from_pretrained of a model PaddleNLP 2 names left its weights under their URL's name beside the
    model_config.json of its arguments; the folder reads as the model, whatever path names it. A folder whose
    weights are not named after it is no cache of PaddleNLP's, and is refused."""
    cache = HERE / "paddlenlp2-cache" / "bert-toy"
    checkpoint, saved = load_checkpoint(cache), load_checkpoint(PADDLENLP2)
    assert (checkpoint.info.format, checkpoint.config) == ("paddlenlp-dir", saved.config)
    assert all(np.array_equal(checkpoint.weights[name], saved.weights[name]) for name in saved.weights)
    assert checkpoint.info.notes[0].startswith("read bert-toy.pdparams (PaddleNLP 2's download cache")
    assert load_checkpoint(cache / ".." / "bert-toy").config == saved.config
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for file in cache.iterdir():
        (renamed / file.name).write_bytes(file.read_bytes())
    with pytest.raises(WeightsError, match="is a directory, but none bert_multi reads"):
        load_checkpoint(renamed)
    # A directory that happens to share its weights file's name is no cache: its config.json is read as saved.
    named_so = tmp_path / "model_state"
    named_so.mkdir()
    for file in PRETRAINING.iterdir():
        (named_so / file.name).write_bytes(file.read_bytes())
    assert "download cache" not in load_checkpoint(named_so).info.notes[0]


def test_a_paddlenlp_directory_without_its_config_names_both_kinds(tmp_path):
    (tmp_path / "model_state.pdparams").write_bytes((PRETRAINING / "model_state.pdparams").read_bytes())
    with pytest.raises(
        WeightsError, match="no config.json \\(PaddleNLP 2.4.3 on\\) or model_config.json \\(2.0 to 2.4.2\\)"
    ):
        load_checkpoint(tmp_path)


# PaddleNLP 3's save_pretrained of paddlenlp-pretraining/'s weights, each as the file its from_pretrained
# loads first: safetensors (safe_serialization=True), or shards beside an index (max_shard_size).
PADDLENLP3 = {
    "paddlenlp3-safetensors": "read model.safetensors and config.json",
    "paddlenlp3-shards": "read the shards model.safetensors.index.json names and config.json",
    "paddlenlp3-pdparams-shards": "read the shards model_state.pdparams.index.json names and config.json",
}


@pytest.mark.parametrize("name", PADDLENLP3)
def test_paddlenlp_3s_files_read_as_the_weights_paddlenlp_2_8_saved(name):
    """PaddleNLP 3 loaded paddlenlp-pretraining/ and saved it again: each of its files reads to the same
    weights, so to what PaddleNLP computes (the generator checked that PaddleNLP 3 computes the same bits)."""
    checkpoint = load_checkpoint(HERE / name)
    assert checkpoint.info.format == "paddlenlp-dir" and checkpoint.info.notes[0].startswith(PADDLENLP3[name])
    original = load_checkpoint(PRETRAINING)
    assert checkpoint.config == original.config
    assert sorted(checkpoint.weights) == sorted(original.weights)
    assert all(np.array_equal(checkpoint.weights[n], original.weights[n]) for n in original.weights)
    assert mismatches(outputs(checkpoint.config, checkpoint.weights), "float64") == []


def test_paddlenlp_3s_safetensors_are_paddles_layout_and_its_metadata_says_so():
    """The file is safetensors, as transformers' are, but holds Paddle's names and (in, out) layout, which
    its metadata's format ('np', not transformers' 'pt') tells; q_proj is square, so nothing else would."""
    file = HERE / "paddlenlp3-safetensors" / "model.safetensors"
    assert read_metadata(file) == {"format": "np"}
    kernel = read_safetensors(file)[0]["bert.encoder.layers.0.self_attn.q_proj.weight"]
    assert kernel.shape == (8, 8) and not np.array_equal(kernel, kernel.T)
    assert np.array_equal(load_checkpoint(file.parent).weights["encoder.blks.0.attention.W_q.weight"], kernel.T)


def test_paddlenlp_3s_bfloat16_safetensors_hold_uint16_bits_read_as_bfloat16():
    """PaddleNLP 3 saves a bfloat16 model's tensors as uint16 (safetensors' U16): their bits are bfloat16's."""
    directory = HERE / "paddlenlp3-bfloat16"
    arrays, dtypes = read_safetensors(directory / "model.safetensors")
    assert set(dtypes.values()) == {"uint16"}
    with pytest.raises(WeightsError, match="is bfloat16; .*pass dtype='float32'"):
        load_checkpoint(directory)
    checkpoint = load_checkpoint(directory, dtype="float32")
    assert "read 48 bfloat16 arrays from the uint16 bits Paddle saves them as" in checkpoint.info.notes
    assert {tensor.dtype for tensor in checkpoint.info.tensors} == {"bfloat16"}
    original = load_checkpoint(PRETRAINING).weights
    for name, array in checkpoint.weights.items():  # Paddle 3 rounds to the nearest bfloat16, ties to even
        bits = original[name].view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
        assert array.tobytes() == rounded.tobytes(), name
    bits = arrays["bert.embeddings.word_embeddings.weight"]
    assert np.array_equal(
        (bits.astype(np.uint32) << 16).view(np.float32), checkpoint.weights["encoder.token_embedding.weight"]
    )


def test_a_transformers_safetensors_in_a_paddlenlp_directory_is_refused(tmp_path):
    """The metadata, not the names, decides the layout: a file that says transformers' ('pt') in a directory
    whose config PaddleNLP wrote is neither read as Paddle's layout nor silently as transformers'."""
    (tmp_path / "config.json").write_bytes((HERE / "paddlenlp3-safetensors" / "config.json").read_bytes())
    arrays, _ = read_safetensors(HERE / "paddlenlp3-safetensors" / "model.safetensors")
    write_safetensors(tmp_path / "model.safetensors", arrays, {"format": "pt"})
    with pytest.raises(WeightsError, match="metadata's format is 'pt', where PaddleNLP writes 'np'"):
        load_checkpoint(tmp_path)


def test_a_paddlenlp_config_without_weights_names_the_files_it_looked_for(tmp_path):
    (tmp_path / "config.json").write_bytes((HERE / "paddlenlp3-safetensors" / "config.json").read_bytes())
    with pytest.raises(WeightsError, match=r"PaddleNLP config.json but no weights: expected one of .*model_state"):
        load_checkpoint(tmp_path)


def test_paddlenlps_weights_file_alone_says_it_is_paddlenlps_and_what_to_name(tmp_path):
    """As a file of PaddleNLP's download cache is: model_state.pdparams's bytes under the model's own name."""
    (tmp_path / "bert-base-uncased.pdparams").write_bytes((PRETRAINING / "model_state.pdparams").read_bytes())
    with pytest.raises(WeightsError, match="look like PaddleNLP's BERT") as raised:
        load_checkpoint(tmp_path / "bert-base-uncased.pdparams", num_heads=2)
    assert "name the directory holding the file and its config.json, or PaddleNLP 2's model_config.json" in str(
        raised.value
    )
    assert "HuggingFace" not in str(raised.value)


@pytest.mark.parametrize("name", ["paddlenlp-pretraining", "paddlenlp-model"])
def test_bert_multi_writes_the_directory_paddlenlp_saved(name, tmp_path):
    """Read and written again, a PaddleNLP directory holds what PaddleNLP's own save_pretrained wrote: the same
    names, layouts and bytes, and config.json's fields (the canonical file between them keeps the weights)."""
    convert(HERE / name, tmp_path / "w.npz")
    convert(tmp_path / "w.npz", tmp_path / "through-npz", framework="paddlenlp")
    convert(HERE / name, tmp_path / "out", framework="paddlenlp")
    assert (tmp_path / "through-npz" / "model_state.pdparams").read_bytes() == (
        tmp_path / "out" / "model_state.pdparams"
    ).read_bytes()
    written, written_dtypes, _ = read_pdparams(tmp_path / "out" / "model_state.pdparams")
    original, original_dtypes, _ = read_pdparams(HERE / name / "model_state.pdparams")
    assert sorted(written) == sorted(original) and written_dtypes == original_dtypes
    assert all(np.array_equal(written[key], original[key]) for key in original)
    fields = json.loads((tmp_path / "out" / "config.json").read_text())
    saved = json.loads((HERE / name / "config.json").read_text())
    assert fields == {key: saved[key] for key in fields}  # but PaddleNLP's switch for its fused layers, off
    assert set(saved) - set(fields) == {"fuse"}


def test_what_no_paddlenlp_bert_computes_is_refused_before_anything_is_written(tmp_path):
    d2l = bm.CONFIGS["chapter"]
    original = load_checkpoint(PRETRAINING).config
    cases = {
        "d2l": (d2l, "PaddleNLP's BERT computes the original BERT"),
        "no pooler": (dataclasses.replace(original, heads=("mlm",)), "no BERT class with exactly the heads"),
        "tanh GELU": (
            dataclasses.replace(original, semantics=dataclasses.replace(original.semantics, activation="gelu_tanh")),
            "computes gelu or relu; this model gelu_tanh",
        ),
        "own decoder": (
            dataclasses.replace(original, semantics=dataclasses.replace(original.semantics, mlm_decoder="own")),
            "decoder is the word embeddings",
        ),
    }
    for config, message in cases.values():
        with pytest.raises(bm.UsageError, match=message):
            bm.save_checkpoint(tmp_path / "out", config, bm.random_weights(config), framework="paddlenlp")
        assert not (tmp_path / "out").exists()


def test_a_directory_holding_a_file_paddlenlp_loads_first_is_not_written_over(tmp_path):
    """PaddleNLP loads model.safetensors before model_state.pdparams: one left there would shadow what is written."""
    target = tmp_path / "out"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"earlier")
    checkpoint = load_checkpoint(PRETRAINING)
    with pytest.raises(bm.UsageError, match="holds model.safetensors, which PaddleNLP's from_pretrained loads before"):
        bm.save_checkpoint(target, checkpoint.config, checkpoint.weights, framework="paddlenlp")
    assert sorted(path.name for path in target.iterdir()) == ["model.safetensors"]


def test_convert_writes_a_paddlenlp_directory_into_one_made_first_and_checks_it(tmp_path, capsys):
    from bert_multi.cli import main

    (tmp_path / "out").mkdir()
    source = HERE / "pretrained"  # Google's TensorFlow checkpoint
    assert main(["convert", str(source), str(tmp_path / "out"), "--framework", "paddlenlp", "--check"]) == 0
    said = capsys.readouterr().out
    assert f"wrote {tmp_path / 'out'}: PaddleNLP BERT directory" in said
    assert f"{tmp_path / 'out'} computes what {source} computes" in said
    assert inspect_checkpoint(tmp_path / "out").format == "paddlenlp-dir"


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    heads=st.sampled_from([("pooler", "mlm", "nsp"), ("pooler", "mlm"), ("pooler",)]),
    activation=st.sampled_from(["gelu", "relu"]),
    eps=st.sampled_from([1e-12, 1e-5]),
    sizes=st.fixed_dictionaries(
        {
            "vocab_size": st.integers(3, 12),
            "ffn_num_hiddens": st.integers(1, 5),
            "num_blks": st.integers(1, 3),
            "max_len": st.integers(1, 6),
        }  # fmt: skip
    ),
    dtype=st.sampled_from(["float32", "float64"]),
    seed=st.integers(0, 2**16),
)
def test_any_model_paddlenlp_computes_round_trips_bit_identically(tmp_path, heads, activation, eps, sizes, dtype, seed):
    semantics = dataclasses.replace(PRESETS["bert"], activation=activation, layer_norm_eps=eps)
    config = bm.BERTConfig(**sizes, num_hiddens=4, num_heads=2, dropout=0.1, semantics=semantics, heads=heads)
    weights = bm.random_weights(config, seed=seed, dtype=dtype)
    target = tmp_path / f"{seed}-{len(heads)}-{dtype}"
    bm.save_checkpoint(target, config, weights, framework="paddlenlp")
    loaded = load_checkpoint(target)
    assert loaded.config == config and sorted(loaded.weights) == sorted(weights)
    assert all(loaded.weights[n].dtype == weights[n].dtype for n in weights)
    assert all(loaded.weights[n].tobytes() == weights[n].tobytes() for n in weights)


def test_a_directory_of_both_libraries_files_is_read_as_its_config_says(tmp_path):
    """PaddleNLP's weights beside transformers' under transformers' config.json: a transformers directory (as
    transformers reads it); under PaddleNLP's config.json, PaddleNLP's. What bert_multi writes says PaddleNLP's."""
    checkpoint = load_checkpoint(PRETRAINING)
    bm.save_checkpoint(tmp_path / "both", checkpoint.config, checkpoint.weights, framework="huggingface")
    (tmp_path / "both" / "model_state.pdparams").write_bytes((PRETRAINING / "model_state.pdparams").read_bytes())
    both = load_checkpoint(tmp_path / "both")
    assert both.info.format == "hf-dir" and both.info.notes[0].startswith("read model.safetensors")
    bm.save_checkpoint(tmp_path / "written", checkpoint.config, checkpoint.weights, framework="paddlenlp")
    (tmp_path / "written" / "pytorch_model.bin").write_bytes(b"a transformers file PaddleNLP never loads")
    assert inspect_checkpoint(tmp_path / "written").format == "paddlenlp-dir"


def test_what_paddlenlp_and_transformers_both_record_beyond_the_model_goes_from_one_to_the_other(tmp_path):
    """pad_token_id (which PaddleNLP masks by when given no attention mask) and initializer_range, through
    transformers' directory and back; neither library's own fields go to the other's config.json."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("model_state.pdparams", "config.json"):
        (source / name).write_bytes((PRETRAINING / name).read_bytes())
    fields = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**fields, "pad_token_id": 5, "initializer_range": 0.5}))
    convert(source, tmp_path / "hf", framework="huggingface")
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (hf["pad_token_id"], hf["initializer_range"]) == (5, 0.5)
    assert not {"paddlenlp_version", "fuse", "pool_act"} & set(hf)
    convert(tmp_path / "hf", tmp_path / "back", framework="paddlenlp")
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (back["pad_token_id"], back["initializer_range"]) == (5, 0.5)
    assert not {"transformers_version", "tie_word_embeddings"} & set(back)
    hf["pad_token_id"] = None  # a value PaddleNLP cannot mask by is left to its default
    (tmp_path / "hf" / "config.json").write_text(json.dumps(hf))
    convert(tmp_path / "hf", tmp_path / "default", framework="paddlenlp")
    assert "pad_token_id" not in json.loads((tmp_path / "default" / "config.json").read_text())


def test_a_bert_of_paddles_fused_layers_is_refused_by_name():
    """PaddleNLP builds its BERT of Paddle's fused layers where config.json says fuse: their names pack q, k
    and v (qkv_weight of (3, heads, head size, hidden)), and they compute on a GPU only, so nothing here could
    check a reading of them: refused, saying so, not listed as tensors of no known layer."""
    directory = HERE / "paddlenlp3-fused"
    assert "bert.encoder.0.fused_attn.qkv_weight" in read_pdparams(directory / "model_state.pdparams")[0]
    with pytest.raises(WeightsError, match="has fuse true: PaddleNLP's fused encoder layers"):
        load_checkpoint(directory)


def test_paddlenlp_3s_safetensors_alone_is_named_as_paddlenlps_not_read_as_transformers(tmp_path):
    """Its embeddings are named as transformers names them, but not its blocks, nor is its layout
    transformers': the file alone says whose it is and to name its directory, read as one."""
    (tmp_path / "bert.safetensors").write_bytes((HERE / "paddlenlp3-safetensors" / "model.safetensors").read_bytes())
    for path in (tmp_path / "bert.safetensors", HERE / "paddlenlp3-safetensors" / "model.safetensors"):
        with pytest.raises(WeightsError, match="look like PaddleNLP's BERT.*name the directory holding the file"):
            load_checkpoint(path, num_heads=2)
