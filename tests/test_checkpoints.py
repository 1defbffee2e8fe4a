"""Optional heads, reading and writing every checkpoint format, and the ``inspect``/``convert`` commands.
(Files saved by the original d2l code: ``conformance/test_original_checkpoints.py``.)"""

import itertools
import json
import re
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bert_multi
from bert_multi import (
    CONFIGS,
    BERTConfig,
    WeightsError,
    backends,
    convert,
    inspect_checkpoint,
    load_backend,
    load_checkpoint,
    param_shapes,
    random_weights,
    save_checkpoint,
    save_weights,
)
from bert_multi.backend import framework_names
from bert_multi.cli import main
from bert_multi.engine.cases import CASES
from bert_multi.engine.conform import run_conformance
from bert_multi.engine.results import Target
from bert_multi.files.formats.gluon import NAME_RULES
from bert_multi.spec.config import HEADS
from bert_multi.spec.semantics import PRESETS
from conftest import runs_here

AVAILABLE = {name for name, status in backends().items() if status.available}
FRAMEWORKS = sorted(AVAILABLE & {"torch", "mxnet"})
# Every heads choice a generation allows (d2l 0.11's pooler is part of its NSP head).
HEAD_CHOICES = [
    (preset, heads)
    for preset in PRESETS
    for count in range(len(HEADS) + 1)
    for heads in itertools.combinations(HEADS, count)
    if not ("nsp" in heads and "pooler" not in heads)
    and not (preset == "d2l-0.11" and ("pooler" in heads) != ("nsp" in heads))
]


def small(preset="d2l", heads=HEADS, **sizes):
    base = dict(vocab_size=13, num_hiddens=8, ffn_num_hiddens=6, num_heads=2, num_blks=2, max_len=10)
    return BERTConfig(**{**base, **sizes}, semantics=preset, heads=heads)


# --- Optional heads ------------------------------------------------------------------------------------


def test_heads_are_checked_and_kept_in_one_order():
    assert small(heads=["nsp", "pooler"]).heads == ("pooler", "nsp")
    with pytest.raises(ValueError, match="'nsp' needs 'pooler'"):
        small(heads=("nsp",))
    with pytest.raises(ValueError, match="in d2l 0.11 the pooler is the first layer of the NSP head"):
        small("d2l-0.11", heads=("pooler",))
    with pytest.raises(ValueError, match="unknown head"):
        small(heads=("pooler", "classifier"))
    with pytest.raises(ValueError, match="must be a tuple"):
        small(heads="pooler")
    assert "heads" not in small().to_dict() and small(heads=()).to_dict()["heads"] == []
    assert BERTConfig.from_dict(small(heads=("mlm",)).to_dict()) == small(heads=("mlm",))


@pytest.mark.parametrize("preset, heads", HEAD_CHOICES, ids=[f"{p}-{'+'.join(h) or 'none'}" for p, h in HEAD_CHOICES])
def test_a_model_without_a_head_has_none_of_its_weights_and_returns_none_for_it(preset, heads):
    config = small(preset, heads)
    full = small(preset)
    names = list(param_shapes(config))
    # The schema is the full one with the absent parts' tensors taken out, in the same order.
    assert names == [name for name in param_shapes(full) if name in names]
    assert any(name.startswith("mlm.") for name in names) == ("mlm" in heads)
    weights = random_weights(full, seed=5, dtype="float64")
    batch = CASES[0].batch(config)
    reference = load_backend("numpy").build(full, weights)(**batch, intermediates=True)
    out = load_backend("numpy").build(config, {n: weights[n] for n in names})(**batch, intermediates=True)
    np.testing.assert_array_equal(out.encoded, reference.encoded)  # the encoder does not depend on the heads
    for head, output in (("mlm", out.mlm), ("nsp", out.nsp)):
        if head in heads:
            np.testing.assert_array_equal(output, getattr(reference, head))
        else:
            assert output is None
    assert ("pooler" in out.intermediates) == ("pooler" in heads)
    for framework in FRAMEWORKS:
        model = load_backend(framework).build(config, {n: weights[n] for n in names}, dtype="float64")
        got = model(**batch, intermediates=True)
        assert list(got.intermediates) == list(out.intermediates)
        assert (got.mlm is None, got.nsp is None) == (out.mlm is None, out.nsp is None)
        assert list(model.export_weights()) == names


def test_conformance_compares_what_exists_and_the_report_says_what_was_absent(capsys, tmp_path):
    config = small(heads=("pooler",))
    weights = random_weights(config, seed=2, dtype="float64")
    report = run_conformance(config, weights, [Target("numpy", "float32")], [(c.name, c.batch(config)) for c in CASES])
    assert report.passed and report.checks
    compared = {c.name for check in report.checks for c in check.outputs}
    assert compared == {"encoded"}
    assert all("pooler" in {c.name for c in check.intermediates} for check in report.checks)
    save_checkpoint(tmp_path / "encoder.npz", config, weights)
    assert main(["compare", str(tmp_path / "encoder.npz"), "--backends", "numpy", "--no-pairs"]) == 0
    assert "absent from this model, so not compared: mlm, nsp" in capsys.readouterr().out


def test_pretraining_needs_both_heads():
    from bert_multi.training import check_trainable

    with pytest.raises(ValueError, match="pretraining needs the pooler and both heads"):
        check_trainable(small(heads=("pooler", "mlm")), True)


# --- Every format, both ways --------------------------------------------------------------------------

SUFFIXES = {"npz": ".npz", "torch": ".pt", "mxnet": ".params", "jax": ".msgpack", "paddle": ".pdparams"}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    choice=st.sampled_from(HEAD_CHOICES),
    sizes=st.fixed_dictionaries(
        {
            "vocab_size": st.integers(3, 12),
            "num_hiddens": st.sampled_from([2, 4, 6]),
            "ffn_num_hiddens": st.integers(1, 5),
            "num_blks": st.integers(1, 3),
            "max_len": st.integers(1, 6),
        }
    ),
    dtype=st.sampled_from(["float32", "float64"]),
    route=st.lists(st.sampled_from([*SUFFIXES, "dir-torch", "dir-mxnet", "dir-paddle"]), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_any_config_round_trips_bit_identically_through_every_format(tmp_path, choice, sizes, dtype, route, seed):
    preset, heads = choice
    if preset == "d2l-0.11":  # no file holds its computed table's length: d2l 0.11's default is read back
        sizes = {**sizes, "max_len": 1000}
    config = BERTConfig(**sizes, num_heads=2, semantics=preset, heads=heads)
    weights = random_weights(config, seed=seed, dtype=dtype)
    vocab = [f"t{i}" for i in range(config.vocab_size)]
    source = tmp_path / f"start-{seed}.npz"
    save_checkpoint(source, config, weights)
    for step, kind in enumerate(route):
        framework = kind.removeprefix("dir-")
        if framework not in ("npz", "jax", "paddle", *AVAILABLE):  # Flax's and Paddle's files need neither
            continue
        target = tmp_path / (f"{seed}-{step}-{kind}" + ("" if kind.startswith("dir") else SUFFIXES[kind]))
        convert(source, target, framework=framework if kind.startswith("dir") else None, vocab=vocab,
                num_heads=2, preset=preset)  # fmt: skip
        source = target
    loaded = load_checkpoint(source, num_heads=2, preset=preset)
    assert loaded.config == config
    assert list(loaded.weights) == list(weights)
    assert all(
        loaded.weights[n].dtype == weights[n].dtype and loaded.weights[n].tobytes() == weights[n].tobytes()
        for n in weights
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dtype_casts_every_tensor_to_what_was_asked(tmp_path, dtype):
    config = small()
    weights = random_weights(config, seed=4, dtype="float64")
    save_checkpoint(tmp_path / "w.npz", config, weights)
    loaded = load_checkpoint(tmp_path / "w.npz", dtype=dtype).weights
    for name, array in weights.items():
        assert loaded[name].dtype == np.dtype(dtype)
        assert loaded[name].tobytes() == array.astype(dtype).tobytes()


@pytest.mark.skipif("torch" not in AVAILABLE, reason="needs the torch backend")
def test_names_of_another_family_say_which_it_looks_like(tmp_path):
    import torch

    # A transformers BERT's state_dict is read as one (tests/test_huggingface.py); one short of a layer says
    # what it lacks, in transformers' names.
    torch.save({"bert.embeddings.word_embeddings.weight": torch.zeros(3, 2)}, tmp_path / "hf.pt")
    with pytest.raises(WeightsError, match="its names are a transformers BERT's, but it lacks") as raised:
        load_checkpoint(tmp_path / "hf.pt", num_heads=1)
    assert "'embeddings.position_embeddings.weight'" in str(raised.value)
    assert "word_embeddings" not in str(raised.value)
    # As PyTorch Lightning saves a LightningModule holding a BertForPreTraining as its attribute ``model``.
    torch.save({"model.bert.embeddings.word_embeddings.weight": torch.zeros(3, 2)}, tmp_path / "lightning.pt")
    with pytest.raises(
        WeightsError, match="look like a HuggingFace transformers BERT.*under 'model.'.*--prefix model."
    ):
        load_checkpoint(tmp_path / "lightning.pt", num_heads=1)
    q_proj = "bert.encoder.layers.0.self_attn.q_proj.weight"
    torch.save({f"module.classifier.{q_proj}": torch.zeros(2, 2)}, tmp_path / "paddlenlp.pt")
    with pytest.raises(WeightsError, match="look like PaddleNLP's BERT.*under 'classifier.'"):  # module. is stripped
        load_checkpoint(tmp_path / "paddlenlp.pt", num_heads=1)


@pytest.mark.skipif("torch" not in AVAILABLE, reason="needs the torch backend")
def test_a_stated_prefix_reads_the_model_under_it_and_lists_the_wrappers_other_tensors(tmp_path):
    import torch

    config = small()
    weights = random_weights(config, seed=3)
    wrapper = {f"net.{name}": torch.from_numpy(array) for name, array in weights.items()}
    wrapper["loss.weight"] = torch.ones(13)  # a weighted loss beside the model, as a LightningModule holds it
    torch.save(wrapper, tmp_path / "wrapper.pt")
    with pytest.raises(WeightsError, match="look like a d2l BERT; its names are under 'net.'.*--prefix net."):
        load_checkpoint(tmp_path / "wrapper.pt", num_heads=2, preset="d2l")
    torch.save({f"bert.{name}": torch.from_numpy(array) for name, array in weights.items()}, tmp_path / "bert.pt")
    with pytest.raises(WeightsError, match="look like a d2l BERT; its names are under 'bert.'.*--prefix bert."):
        load_checkpoint(tmp_path / "bert.pt", num_heads=2, preset="d2l")  # d2l's names have no bert. of their own
    read = load_checkpoint(tmp_path / "wrapper.pt", num_heads=2, preset="d2l", prefix="net")
    assert read.info.notes == [
        "read the tensors under the prefix 'net.' without it, leaving out the wrapper's ['loss.weight']"
    ]
    assert read.info.ignored == []
    assert all(np.array_equal(read.weights[name], array) for name, array in weights.items())
    assert inspect_checkpoint(tmp_path / "wrapper.pt", prefix="net.").sizes["vocab_size"] == 13
    with pytest.raises(
        WeightsError, match=r"no tensor name begins with 'model.'; the file's names begin with \['loss.', 'net.'\]"
    ):
        load_checkpoint(tmp_path / "wrapper.pt", num_heads=2, prefix="model.")
    save_weights(tmp_path / "w.npz", config, weights)
    with pytest.raises(WeightsError, match="names its tensors as its model does; prefix='net.' applies"):
        load_checkpoint(tmp_path / "w.npz", prefix="net.")


@pytest.mark.skipif("torch" not in AVAILABLE, reason="needs the torch backend")
@pytest.mark.parametrize("wrappers", [("module.", "_orig_mod."), ("_orig_mod.", "module."), ("net.", "_orig_mod.")])
def test_the_prefixes_of_pytorchs_wrappers_are_stripped_in_either_nesting_and_said(tmp_path, wrappers):
    import torch

    config = small()
    weights = random_weights(config, seed=4)
    outer = "".join(wrappers)  # nn.DataParallel(torch.compile(net)) saves 'module._orig_mod.encoder...'
    torch.save({outer + name: torch.from_numpy(array) for name, array in weights.items()}, tmp_path / "wrapped.pt")
    stated = {"prefix": "net."} if wrappers[0] == "net." else {}
    read = load_checkpoint(tmp_path / "wrapped.pt", num_heads=2, preset="d2l", **stated)
    said = [note.split(" from every name")[0] for note in read.info.notes if note.startswith("stripped")]
    assert said == [f"stripped the prefix {prefix!r}" for prefix in wrappers if prefix != "net."]
    assert all(np.array_equal(read.weights[name], array) for name, array in weights.items())


@pytest.mark.skipif("torch" not in AVAILABLE, reason="needs the torch backend")
def test_a_name_under_the_wrappers_prefix_twice_never_takes_the_place_of_another(tmp_path):
    """'module.module.x' and 'module.x' stripped are 'module.x' and 'x': whichever the file holds first."""
    import torch

    config = small()
    weights = random_weights(config, seed=5)
    first = "encoder.token_embedding.weight"
    state = {f"module.module.{first}": torch.zeros(weights[first].shape)}  # before the real one, in the file
    state.update({f"module.{name}": torch.from_numpy(array) for name, array in weights.items()})
    torch.save(state, tmp_path / "twice.pt")
    read = load_checkpoint(tmp_path / "twice.pt", num_heads=2, preset="d2l")
    assert all(np.array_equal(read.weights[name], array) for name, array in weights.items())
    assert read.info.ignored == [f"module.{first}"]


@pytest.mark.parametrize("prefix", ["", ".", "net..blk", "net\n"])
def test_a_prefix_that_names_no_attribute_is_refused_before_any_file_is_read(tmp_path, prefix):
    with pytest.raises(bert_multi.UsageError, match="expected the attribute path the model's tensors are under"):
        load_checkpoint(tmp_path / "absent.pt", num_heads=2, prefix=prefix)
    with pytest.raises(bert_multi.UsageError, match="expected the attribute path"):
        inspect_checkpoint(tmp_path / "absent.pt", prefix=prefix)


def test_gluonnlps_names_with_a_tensor_of_no_bert_layer_or_without_a_segment_embedding_are_refused(tmp_path):
    # A tensor BERT has not is named; GluonNLP's RoBERTa and DistilBERT share its BERT's names but have no
    # token_type_embed: another model, not read as BERT.
    from hostile import TF_CHECKPOINT, params_bytes

    from bert_multi.files.formats.gluon import read_params

    arrays = read_params(TF_CHECKPOINT.parent / "gluonnlp-bert.params")
    (tmp_path / "extra.params").write_bytes(params_bytes({**arrays, "adapter.weight": arrays["pooler.bias"]}))
    with pytest.raises(WeightsError, match=r"GluonNLP's BERTModel's names, but tensors of no BERT layer: \['adapter"):
        load_checkpoint(tmp_path / "extra.params", num_heads=2)
    del arrays["token_type_embed.0.weight"]
    (tmp_path / "roberta.params").write_bytes(params_bytes(arrays))
    with pytest.raises(WeightsError, match="look like GluonNLP's RoBERTa or DistilBERT"):
        load_checkpoint(tmp_path / "roberta.params", num_heads=2)


def test_a_canonical_file_records_everything_and_statements_must_agree(tmp_path):
    config = small("d2l-0.12")
    save_checkpoint(tmp_path / "w.npz", config, random_weights(config))
    assert load_checkpoint(tmp_path / "w.npz").config == config
    with pytest.raises(WeightsError, match="records num_heads=2; 4 was stated"):
        load_checkpoint(tmp_path / "w.npz", num_heads=4)
    with pytest.raises(ValueError, match="not both"):
        load_checkpoint(tmp_path / "w.npz", preset="d2l", d2l_version="1.0")
    info = inspect_checkpoint(tmp_path / "w.npz")
    assert (info.format, info.config, info.unknowns) == ("npz", config, {})


@pytest.mark.skipif("mxnet" not in AVAILABLE, reason="needs the mxnet backend to write a Gluon file")
def test_d2l_0_11_needs_no_statement_of_its_generation_only_of_its_heads(tmp_path):
    config = small("d2l-0.11", max_len=1000)
    load_backend("mxnet").save_checkpoint(tmp_path / "old.params", config, random_weights(config))
    info = inspect_checkpoint(tmp_path / "old.params")
    assert info.presets == ("d2l-0.11",) and set(info.unknowns) == {"num_heads", "max_len"}
    assert load_checkpoint(tmp_path / "old.params", num_heads=2).config == config


# --- The commands -------------------------------------------------------------------------------------


def test_inspect_prints_a_table_and_writes_json(tmp_path, capsys):
    config = small()
    save_checkpoint(tmp_path / "w.npz", config, random_weights(config))
    assert main(["inspect", str(tmp_path / "w.npz"), "--json", str(tmp_path / "info.json")]) == 0
    out = capsys.readouterr().out
    assert "tensor" in out and "encoder.blks.1.ffn.dense2.bias" in out and "fits: d2l (d2l 0.16 - 1.0)" in out
    document = json.loads((tmp_path / "info.json").read_text())
    assert document["config"] == config.to_dict() and len(document["tensors"]) == len(param_shapes(config))


@pytest.mark.skipif("mxnet" not in AVAILABLE, reason="needs the mxnet backend")
def test_convert_states_what_the_file_cannot_tell_and_compare_reads_any_format(tmp_path, capsys):
    config = small()
    load_backend("mxnet").save_checkpoint(tmp_path / "d2l.params", config, random_weights(config))
    assert main(["convert", str(tmp_path / "d2l.params"), str(tmp_path / "out.npz")]) == 2
    error = capsys.readouterr().err  # all that is missing, at once, in the command line's spelling
    assert "state --num-heads and --preset or --d2l-version to read it" in error and "num_heads=" not in error
    assert main(["convert", str(tmp_path / "d2l.params"), str(tmp_path / "out.npz"), "--num-heads", "2",
                 "--d2l-version", "1.0.3"]) == 0  # fmt: skip
    assert "wrote" in capsys.readouterr().out
    assert bert_multi.load_weights(tmp_path / "out.npz")[0] == config
    assert main(["compare", str(tmp_path / "d2l.params"), "--num-heads", "2", "--preset", "d2l", "--backends",
                 "numpy", "--no-pairs"]) == 0  # fmt: skip
    assert main(["convert", str(tmp_path / "d2l.params"), str(tmp_path / "out.txt"), "--num-heads", "2"]) == 2
    assert "unknown output suffix '.txt'" in capsys.readouterr().err
    # d2l names its directories bert.small, bert.base: with --framework, a suffix of no format is a directory's
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps([f"t{i}" for i in range(config.vocab_size)]))
    assert main(["convert", str(tmp_path / "d2l.params"), str(tmp_path / "bert.small"), "--num-heads", "2",
                 "--d2l-version", "1.0.3", "--framework", "mxnet", "--vocab", str(vocab)]) == 0  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "bert.small").iterdir()) == ["pretrained.params", "vocab.json"]
    assert main(["conform", "--config", "tiny", "--num-heads", "2"]) == 2
    assert "--num-heads: these describe a checkpoint file" in capsys.readouterr().err
    assert main(["conform", "--config", "tiny", "--key", "state_dict", "--prefix", "model."]) == 2
    assert "--key, --prefix: these describe a checkpoint file" in capsys.readouterr().err


# --- d2l pretrained-model directories and zips are hostile until checked --------------------------------


def gluon_directory(tmp_path, vocab):
    """A d2l directory holding a Gluon pretrained.params (written without MXNet) and ``vocab``."""
    from hostile import params_bytes

    config = small()
    directory = tmp_path / "bert.small"
    directory.mkdir()
    names = framework_names(config, NAME_RULES)
    arrays = [(names[n], a) for n, a in random_weights(config).items()]
    (directory / "pretrained.params").write_bytes(params_bytes(arrays))
    (directory / "vocab.json").write_text(vocab)
    return config, directory


def test_a_d2l_directory_is_read_without_any_framework_and_its_vocab_checked(tmp_path):
    config, directory = gluon_directory(tmp_path, json.dumps([f"t{i}" for i in range(13)]))
    checkpoint = load_checkpoint(directory, num_heads=2, preset="d2l")
    assert checkpoint.config == config and checkpoint.vocab[:2] == ["t0", "t1"]
    (directory / "vocab.json").write_text(json.dumps(["a", "b"]))
    with pytest.raises(WeightsError, match="vocab.json has 2 tokens, but the token embedding has 13 rows"):
        load_checkpoint(directory, num_heads=2, preset="d2l")
    many_lists = "[" + "[]," * 1_000_000 + "[]]"  # parsed, 15 to 25 times its size; refused before parsing
    too_many = "[" + '"a",' * (1 << 20) + '"a"]'
    for bad, why in (
        ("[" * 100_000 + "]" * 100_000, "a JSON list of tokens"),
        ('{"a": 1}', "a JSON list of tokens"),
        (many_lists, "a JSON list of tokens"),
        (too_many, "1048577 tokens; a BERT's vocabulary has at most 1048576"),
        ('["a", "\\q"]', "not valid JSON"),  # shaped as a list of strings, but \q is no JSON escape
    ):
        (directory / "vocab.json").write_text(bad)
        with pytest.raises(WeightsError, match=why):
            inspect_checkpoint(directory)
    (directory / "vocab.json").unlink()
    (directory / "vocab.json").symlink_to(tmp_path / "gone.json")  # a link to nothing: refused, not "no vocab"
    with pytest.raises(WeightsError, match="vocab.json"):
        load_checkpoint(directory, num_heads=2, preset="d2l")


def test_a_zip_member_claiming_to_expand_beyond_reason_is_refused_before_it_is_extracted(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "bomb.zip", "w", compression=zipfile.ZIP_DEFLATED) as out:
        out.writestr("bert.small/pretrained.params", b"\0" * (64 << 20))
    with pytest.raises(WeightsError, match="claims to expand from"):
        inspect_checkpoint(tmp_path / "bomb.zip")


def test_convert_warns_when_the_written_file_cannot_record_what_its_reader_must_then_state(tmp_path, capsys):
    config = CONFIGS["tiny"].with_semantics("0.14.4")  # d2l 0.12-0.15: the tensors of 1.0, valid_lens tiled
    save_weights(tmp_path / "old.npz", config, random_weights(config, seed=5))
    assert main(["convert", str(tmp_path / "old.npz"), str(tmp_path / "old.msgpack")]) == 0
    out = capsys.readouterr().out
    assert (
        f"warning: {tmp_path / 'old.msgpack'} does not record num_heads or the generation: whoever reads it must "
        "state them (--num-heads 3 --preset d2l-0.12; in Python num_heads=3, preset='d2l-0.12')"
    ) in out
    assert "dropout" not in out  # the config line shows what the file holds
    stated = ["--num-heads", "3", "--preset", "d2l-0.12"]
    assert main(["convert", str(tmp_path / "old.msgpack"), str(tmp_path / "back.npz"), *stated]) == 0
    assert "warning" not in capsys.readouterr().out  # a canonical file records both
    assert bert_multi.load_weights(tmp_path / "back.npz")[0] == config


def test_convert_check_runs_the_written_file_and_says_in_one_sentence_what_it_proved(tmp_path, capsys):
    config = CONFIGS["tiny"].with_semantics("0.14.4")
    save_weights(tmp_path / "old.npz", config, random_weights(config, seed=6))
    assert main(["convert", str(tmp_path / "old.npz"), str(tmp_path / "new.npz"), "--check"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(
        f"{tmp_path / 'new.npz'} computes what {tmp_path / 'old.npz'} computes: read back, its weights give the "
        f"float64 oracle the outputs {tmp_path / 'old.npz'}'s give (largest difference 0.0e+00), and the NumPy "
        "oracle runs it in float32 and float64 as in float64 (largest difference "
    )
    assert last.endswith("in float64), over 10 cases, within tolerance")
    # a file that reads back but computes something else is caught (one weight nudged as it is read)
    from bert_multi.cli import convert as command

    real = command.load_checkpoint

    def nudged(path, config, **options):
        checkpoint = real(path, config, **options)
        checkpoint.weights["nsp.output.bias"] = checkpoint.weights["nsp.output.bias"] + 1e-3
        return checkpoint

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(command, "load_checkpoint", nudged)
        assert main(["convert", str(tmp_path / "old.npz"), str(tmp_path / "bad.npz"), "--check"]) == 1
    assert (
        f"{tmp_path / 'bad.npz'} does NOT compute what {tmp_path / 'old.npz'} computes: the float64 oracle's "
        "outputs on them differ by up to 1.0e-03"
    ) in capsys.readouterr().out


def test_what_a_file_fits_is_said_in_its_own_frameworks_terms(tmp_path):
    """d2l published the 0.12 - 0.15 generation for MXNet only: a Gluon file fits "d2l 0.12 - 0.15
    (MXNet)", and a PyTorch or Flax file of the same names fits that generation's computation, ported."""
    from bert_multi import BERTConfig, inspect_checkpoint, random_weights, save_checkpoint

    config = BERTConfig(11, 4, 6, 2, 1, max_len=6)
    weights = random_weights(config)
    said = {}
    for framework, suffix in (("mxnet", "params"), ("jax", "msgpack")):
        path = tmp_path / f"w.{suffix}"
        try:
            save_checkpoint(path, config, weights, framework=framework)
        except Exception as error:  # noqa: BLE001 - MXNet's file is written by MXNet, in its environment
            pytest.skip(f"cannot write a {framework} file here: {error}")
        said[framework] = inspect_checkpoint(path).describe()
    assert "d2l-0.12 (d2l 0.12 - 0.15 (MXNet))" in said["mxnet"]
    assert (
        "d2l-0.12 (d2l 0.12 - 0.15's computation, ported: d2l published that generation for MXNet only)" in said["jax"]
    )
    assert "(MXNet)" not in said["jax"]


def test_a_training_runs_output_names_the_checkpoints_it_holds_in_the_order_of_their_steps(tmp_path):
    config = small(preset="bert", heads=("pooler", "mlm", "nsp"))
    run = tmp_path / "run"  # as transformers' Trainer leaves its output_dir: a checkpoint-N per save
    for step in (10, 2, 4):
        save_checkpoint(run / f"checkpoint-{step}", config, random_weights(config, seed=step), framework="huggingface")
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (run / "runs").mkdir()  # its TensorBoard logs: no checkpoint
    (run / "README.md").write_text("")
    expected = re.escape(
        "it holds ['checkpoint-2/', 'checkpoint-4/', 'checkpoint-10/'], which bert_multi reads, or names with what to "
        "do: name one"
    )
    with pytest.raises(WeightsError, match=expected):
        load_checkpoint(run)
    assert load_checkpoint(run / "checkpoint-10").config.num_blks == config.num_blks
    logs = tmp_path / "checkpoints"  # as PyTorch Lightning's ModelCheckpoint leaves its files
    logs.mkdir()
    for name in ("last.ckpt", "epoch=0-step=2.ckpt", "notes.txt"):
        (logs / name).write_bytes(b"")
    with pytest.raises(WeightsError, match=re.escape("it holds ['epoch=0-step=2.ckpt', 'last.ckpt']")):
        inspect_checkpoint(logs)
    state = tmp_path / "checkpoint_3"  # as accelerate's save_state leaves a step: the model beside the rest
    state.mkdir()
    for name in ("model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"):
        (state / name).write_bytes(b"")
    expected = "it holds ['model.safetensors'], which bert_multi reads, or names with what to do: name one"
    with pytest.raises(WeightsError, match=re.escape(expected)):
        inspect_checkpoint(state)
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError, match="is a directory, but none bert_multi reads"):
        load_checkpoint(tmp_path / "empty")


def test_a_directory_of_many_entries_is_looked_through_for_checkpoints_only_so_far(tmp_path, monkeypatch):
    from bert_multi.files import formats
    from bert_multi.files.formats.base import LISTED

    for number in range(LISTED + 40):
        (tmp_path / f"entry-{number}").mkdir()
    looked_at = []
    monkeypatch.setattr(formats, "is_directory", lambda path: looked_at.append(path) or path.is_dir())
    with pytest.raises(WeightsError, match="is a directory, but none bert_multi reads"):
        load_checkpoint(tmp_path)
    assert len([path for path in looked_at if path.parent == tmp_path]) == LISTED


@pytest.mark.skipif("torch" not in AVAILABLE, reason="needs the torch backend")
@pytest.mark.parametrize("how", ["trace", "script"])
def test_a_torchscript_archive_is_refused_as_a_program_without_advice_to_unpickle(tmp_path, how):
    """torch.load's own refusal of it advises weights_only=False: never to be done with a file of unknown origin."""
    import torch

    dense = torch.nn.Linear(3, 2)
    program = torch.jit.trace(dense, torch.ones(1, 3)) if how == "trace" else torch.jit.script(dense)
    program.save(str(tmp_path / "dense.pt"))
    with pytest.raises(WeightsError, match="a TorchScript archive .*Load it with torch.jit.load") as raised:
        load_checkpoint(tmp_path / "dense.pt", num_heads=1)
    assert "weights_only" not in str(raised.value)
    torch.save(program.state_dict(), tmp_path / "state.pt")  # what the message says to do: a state_dict, read
    with pytest.raises(WeightsError, match="its tensor names are not those of a d2l BERT"):
        load_checkpoint(tmp_path / "state.pt", num_heads=1)


@pytest.mark.skipif("torch" not in AVAILABLE, reason="needs the torch backend")
def test_an_optimizers_state_is_said_to_be_one(tmp_path):
    import torch

    dense = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(dense.parameters())
    dense(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")  # what transformers' Trainer saves beside the model
    with pytest.raises(WeightsError, match=r"keys \['state', 'param_groups'\], not a state_dict; it is an optimizer's"):
        load_checkpoint(tmp_path / "optimizer.pt", num_heads=2)


@pytest.mark.parametrize("name", ["config.json", "bert_config.json", "pretrained.params", "snapshots"])
def test_a_directory_member_linking_to_a_name_too_long_is_a_weights_error(tmp_path, name):
    """Path.is_file raises OSError for a link to a name longer than the system allows: recognizing a directory
    must not, whatever the directory holds."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / name).symlink_to(tmp_path / ("x" * 300))
    (tmp_path / "model" / "model.safetensors").write_bytes(b"")
    (tmp_path / "model" / "refs").mkdir()
    with pytest.raises(WeightsError, match="is a directory of no format bert_multi reads, but it holds"):
        load_checkpoint(tmp_path / "model")


def test_np_save_of_weights_is_told_to_save_them_named_with_savez(tmp_path):
    """np.save of a dict pickles it into an object array, and of one array keeps no name: each is refused with
    the call that saves the weights as an .npz of named arrays, which is read (and holds what was saved)."""
    config = small()
    weights = random_weights(config, seed=4)
    np.save(tmp_path / "dict.npy", weights)  # type: ignore[arg-type]
    np.save(tmp_path / "one.npy", weights["encoder.token_embedding.weight"])
    for name in ("dict.npy", "one.npy"):
        with pytest.raises(WeightsError, match=re.escape("np.savez(path, **weights) saves each under its name")):
            inspect_checkpoint(tmp_path / name)
    np.savez(tmp_path / "named.npz", **weights)
    read = load_checkpoint(tmp_path / "named.npz", num_heads=config.num_heads, preset="d2l")
    assert read.weights.keys() == weights.keys()
    assert all(np.array_equal(read.weights[name], array) for name, array in weights.items())


@runs_here("mxnet")
def test_a_gluon_trainers_saved_states_are_said_to_be_an_optimizers_pickle(tmp_path):
    from mxnet import autograd, gluon, npx
    from mxnet import np as mx_np

    npx.set_np()
    net = gluon.nn.Dense(2, in_units=2)
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.1})
    with autograd.record():
        loss = net(mx_np.ones((1, 2))).sum()
    loss.backward()
    trainer.step(1)
    trainer.save_states(str(tmp_path / "trainer.states"))  # a pickle of MXNet's arrays: Paddle's reader parses it
    expected = (
        "a pickle of MXNet's objects (mxnet.ndarray.ndarray.NDArray): Gluon's "
        "Trainer.save_states pickles an optimizer's state so; the model's weights are the .params file"
    )
    with pytest.raises(WeightsError, match=re.escape(expected)):
        inspect_checkpoint(tmp_path / "trainer.states")


ORIGINAL_BERT = Path(__file__).parent.parent / "conformance" / "original_bert" / "checkpoints"


def _zip(source: Path, target: Path, top: str) -> Path:
    """``source``'s files in a zip, under ``top/`` (as Google's BERT zips hold their directory) or at its root."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(found for found in source.rglob("*") if found.is_file()):
            archive.write(path, str(PurePosixPath(top, *path.relative_to(source).parts)))
    return target


@pytest.mark.parametrize(
    "fixture, top",
    [("pretrained", "uncased_L-2_H-8"), ("flax-pretraining", ""), ("keras-hub-backbone", "preset")],
    ids=["Google's TensorFlow BERT", "a HuggingFace directory", "a KerasHub preset"],
)
def test_a_zipped_checkpoint_directory_reads_as_the_directory_it_holds(tmp_path, fixture, top):
    directory = load_checkpoint(ORIGINAL_BERT / fixture)
    zipped = load_checkpoint(_zip(ORIGINAL_BERT / fixture, tmp_path / "bert.zip", top))
    assert zipped.info.notes[0].startswith(f"extracted the zip and read its {top + '/' if top else 'files'}: ")
    assert zipped.info.notes[1:] == directory.info.notes and zipped.config == directory.config
    assert zipped.weights.keys() == directory.weights.keys()
    assert all(np.array_equal(array, directory.weights[name]) for name, array in zipped.weights.items())


def test_a_zip_that_would_write_outside_itself_or_expand_beyond_reason_is_refused_before_extracting(tmp_path):
    def made(name: str, members: list[tuple[str, bytes]]) -> Path:
        with zipfile.ZipFile(tmp_path / name, "w", zipfile.ZIP_DEFLATED) as archive:
            for member, data in members:
                archive.writestr(member, data)
        return tmp_path / name

    refused = {
        "a name above the zip": (made("up.zip", [("../config.json", b"{}")]), "a name outside the zip's own"),
        "an absolute name": (made("abs.zip", [("/etc/config.json", b"{}")]), "a name outside the zip's own"),
        "zeros that expand a thousand times": (
            made("bomb.zip", [("config.json", b"{}"), *((f"{i}.bin", bytes(1 << 20)) for i in range(3))]),
            "claim to expand to",
        ),
        "a config and nothing a directory reads": (
            made("half.zip", [("x/bert_config.json", b"{}")]),
            "a zip holding ['x/bert_config.json'], which is no checkpoint directory",
        ),
    }
    for case, (path, message) in refused.items():
        with pytest.raises(WeightsError, match=re.escape(message)):
            load_checkpoint(path)
        assert not (tmp_path / "config.json").exists(), case
