"""``verify`` on ports as outsiders write them (``tests/subjects``): built from PyTorch's or Flax's own blocks,
lacking parts d2l's model has, raising on some inputs, computing in float32 only. Each gets a verdict with no map
file, naming each real difference at its module with its numbers, and a port whose maths is d2l's passes."""

import functools
import importlib
import json
import re

import pytest
from subjects import torch_fused, torch_native, torch_repo, torch_scratch, torch_tutorial

from bert_multi import BERTConfig
from bert_multi.backend.registry import not_in_process
from bert_multi.cli import main
from bert_multi.verify.session import verify
from conftest import runs_here

# An even number of heads, so that PyTorch's encoder takes its nested-tensor fast path in inference.
EVEN = BERTConfig(vocab_size=31, num_hiddens=16, ffn_num_hiddens=20, num_heads=4, num_blks=2, max_len=16)
ODD = BERTConfig(vocab_size=31, num_hiddens=15, ffn_num_hiddens=20, num_heads=3, num_blks=2, max_len=16)
WHOLE_LENGTHS = ["full_valid_len", "no_valid_lens", "single_segment", "edge_pred_positions", "no_pred_positions"]

# --- PyTorch's own blocks ----------------------------------------------------------------------------------


@runs_here("torch")
def test_a_port_on_torchs_own_blocks_is_placed_by_their_names_and_each_real_difference_named():
    report = verify(torch_native.build, EVEN, dtypes=["float64"])
    assert not report.passed
    assert report.mapping.how.startswith("names (PyTorch's nn.TransformerEncoderLayer, under the prefix 'encoder.'")
    placed = report.mapping.placements
    assert placed["encoder.blks.1.attention.W_k.weight"].describe() == "encoder.layers.1.self_attn.in_proj_weight[1/3]"
    assert placed["encoder.blks.0.ffn.dense2.bias"].describe() == "encoder.layers.0.linear2.bias"
    # The attention's output is recorded though out_proj is never called (its weight is used functionally).
    assert report.activations["blks.0.attention"] == "encoder.layers.0.self_attn.out_proj (output)"
    # Each real difference, at each module where it is made: the attention of both blocks, and the encoding.
    said = [(diagnosis.mistake.name, diagnosis.where) for diagnosis in report.diagnoses if diagnosis.mistake]
    assert said == [
        ("masked_rows_zero", "encoder.layers.0.self_attn.out_proj"),
        ("masked_rows_zero", "encoder.layers.1.self_attn.out_proj"),
        ("padded_positions_zero", "the encoding your model returns"),
    ]
    assert all(diagnosis.error < 1e-9 for diagnosis in report.diagnoses) and len(report.diagnoses) == 3
    # A key-padding mask cannot take a length per query: that case is the port's error; the others ran.
    raised = {error.case for error in report.forward.errors}
    assert "valid_lens_2d" in raised and len({check.case for check in report.forward.checks}) >= 7
    verdict = report.verdict()
    assert "raised on" in verdict and "valid_lens_2d" in verdict and "--cases " in verdict
    # Observed with the fast path off, its outputs taken as it runs by itself.
    (info,) = report.forward.runtime.values()
    assert "observed with its fast path off; outputs with it on" in str(info["framework"])


@runs_here("torch")
def test_a_pre_norm_port_on_torchs_own_blocks_has_every_diverging_module_named_pooler_included():
    """``norm_first=True``: each block's LayerNorms read before its sublayers, so every activation of a block,
    the encoding and the pooler (reading the last block's residual sum, which no module returns) differ
    from d2l's, and each is put down to pre-norm, none to a module of its own."""
    report = verify(functools.partial(torch_native.build, norm_first=True), ODD, dtypes=["float64"])
    assert not report.passed and report.diagnoses
    unexplained = [diagnosis.describe() for diagnosis in report.diagnoses if diagnosis.mistake is None]
    assert not unexplained
    pooler = [d for d in report.diagnoses if d.activation == "pooler"]
    assert [d.mistake.name for d in pooler if d.mistake] == ["pre_norm"]


@runs_here("torch")
def test_a_port_on_torchs_own_blocks_whose_maths_is_d2ls_passes():
    """Where every sequence keeps its whole length (nothing padded, no row without a key), the same port
    computes d2l's BERT."""
    report = verify(torch_native.build, ODD, cases=WHOLE_LENGTHS)
    assert report.passed, report.failures()
    assert "blks.1.output" in report.activations


@runs_here("torch")
def test_a_port_lacking_the_heads_is_checked_on_what_it_has_and_says_what_it_did_not_check():
    report = verify(torch_scratch.build, ODD, dtypes=["float64"])
    assert report.config.heads == () and set(report.absent) == {"pooler", "mlm", "nsp"}
    assert all("your model has no parameters for" in why for why in report.absent.values())
    assert not report.forward.failures()  # its encoder is d2l's
    assert {error.case for error in report.forward.errors} == {"valid_lens_2d"}
    verdict = report.verdict()
    assert verdict.startswith("FAIL: build conforms where it ran, but raised on 1 of 10 cases (valid_lens_2d: ")
    assert "not checked: the masked-LM head" in verdict and "the pooler" in verdict
    passing = verify(torch_scratch.build, ODD, dtypes=["float64"], cases=WHOLE_LENGTHS)
    assert passing.passed and passing.verdict().startswith("PASS: build computes the BERT of d2l")
    assert "not checked: " in passing.verdict()


@runs_here("torch")
def test_heads_and_a_map_files_absent_parts_say_what_a_model_lacks(tmp_path, capsys):
    argv = ["verify", "tests/subjects/torch_scratch.py:build", "--config", "tiny", "--dtypes", "float64"]
    argv += ["--cases", ",".join(WHOLE_LENGTHS)]
    assert main([*argv, "--heads", "none", "--json", str(tmp_path / "r.json")]) == 0
    document = json.loads((tmp_path / "r.json").read_text())
    assert set(document["not_checked"]) == {"pooler", "mlm", "nsp"}
    assert all(why == "not in the config asked for" for why in document["not_checked"].values())
    (tmp_path / "map.json").write_text(json.dumps({"absent": ["hidden.0.{p}", "mlm.mlp.{i}.{p}", "nsp.output.{p}"]}))
    assert main([*argv, "--map", str(tmp_path / "map.json")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("PASS: ") and f"{tmp_path / 'map.json'} says it lacks" in last
    (tmp_path / "bad.json").write_text(json.dumps({"absent": ["encoder.blks.0.ffn.dense1.{p}"]}))
    assert main([*argv, "--map", str(tmp_path / "bad.json")]) == 2
    assert "are the encoder's, which verify checks in every model" in capsys.readouterr().err


@runs_here("torch")
def test_a_model_that_computes_in_float32_only_is_verified_in_float32():
    factory = functools.partial(torch_scratch.build, float32_only=True)
    report = verify(factory, ODD, dtypes=["float32"], cases=WHOLE_LENGTHS, label="float32 only")
    assert report.passed, report.failures()
    with pytest.raises(ValueError, match="gradients are checked in float64"):
        verify(factory, ODD, dtypes=["float32"], gradients=True)


@runs_here("torch")
def test_the_command_gives_a_port_on_torchs_own_blocks_a_verdict_and_exit_1(capsys):
    argv = ["verify", "tests/subjects/torch_native.py:build", "--config", "tiny", "--dtypes", "float64"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "Traceback (most recent call last)" not in captured.out + captured.err
    last = captured.out.strip().splitlines()[-1]
    assert re.match(r"FAIL: torch_native\.py:build first diverges at blks\.0\.attention", last)
    assert "attend to every key alike" in last


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mask, mistake", [("additive", "additive_mask"), ("boolean", "masked_rows_zero")])
@runs_here("torch")
def test_a_port_with_a_fused_projection_and_torchs_fused_attention_has_its_mask_named(mask, mistake, dtype):
    """One matrix for the queries, keys and values, split in three by order of use; the way its mask treats a
    row with no key to attend to named in either dtype (in float32, -1e6 added to a score rounds it to 1/16)."""
    report = verify(functools.partial(torch_fused.build, mask=mask), ODD, dtypes=[dtype])
    placed = report.mapping.placements
    assert [placed[f"encoder.blks.1.attention.{name}.weight"].describe() for name in ("W_q", "W_k", "W_v")] == [
        f"blocks.1.qkv.weight[{part}/3]" for part in (0, 1, 2)
    ]
    said = [(diagnosis.mistake.name, diagnosis.where) for diagnosis in report.diagnoses if diagnosis.mistake]
    assert said == [(mistake, "blocks.0.proj"), (mistake, "blocks.1.proj")]
    assert len(report.diagnoses) == 2
    assert {check.case for check in report.forward.failures()} == {"mixed_valid_lens", "valid_len_zero"}
    assert {error.case for error in report.forward.errors} == {"valid_lens_2d"}  # one length per sequence only


@runs_here("torch")
def test_a_from_scratch_repositorys_bert_gets_a_verdict_with_its_fixed_positions_and_padded_segments(tmp_path):
    """No parameter for the positions (a sinusoidal buffer), a segment table with a padding row first, no
    pooler and no masked-LM transform: placed with no map file, and a verdict."""
    report = verify(torch_repo.build, EVEN, dtypes=["float64"])
    mapping = report.mapping
    assert mapping.user_name("encoder.segment_embedding.weight") == "model.bert.embedding.segment.weight[1:]"
    assert "encoder.pos_embedding" not in mapping.placements
    assert (
        "none of yours for encoder.pos_embedding (what your model computes in their place is compared)" in mapping.how
    )
    assert report.absent == {
        "mlm": "your model has no parameters for mlm.mlp.0.weight, mlm.mlp.0.bias, mlm.mlp.2.weight ...",
        "pooler": "your model has no parameters for hidden.0.weight, hidden.0.bias",
        "nsp": "it reads the pooler, which is not checked",
    }
    assert not report.passed and report.forward.failures() and not report.forward.errors
    # Every difference named at its module, several at one module where it makes several: its pre-norm
    # blocks, its LayerNorm's form (the unbiased std, eps 1e-6 added to it), its tanh GELU, its fixed
    # positions, its mask made from the tokens.
    found = {
        d.where: {(m.name, str(r)) for m, r in ((d.mistake, d.rule), *d.also)} for d in report.diagnoses if d.mistake
    }
    pre, form = ("pre_norm", "{'pre_norm': True}"), ("layer_norm_form", "{'form': 'unbiased_std_eps', 'eps': 1e-06}")
    tokens, blocks = ("mask_from_tokens", "{'attend': 'tokens'}"), "model.bert.transformer_blocks"
    assert found == {
        f"the input of {blocks}.0.attention.linear_layers.0": {
            pre,
            form,
            ("fixed_positions", "{'positions': 'sinusoidal'}"),
        },
        f"{blocks}.0.attention.output_linear": {tokens},  # its input is the normalised one already
        f"{blocks}.1.attention.output_linear": {tokens, pre},
        **{f"{blocks}.{i}.{norm}_sublayer.norm": {pre, form} for i in range(2) for norm in ("input", "output")},
        **{f"{blocks}.{i}.feed_forward.w_2": {pre, ("activation", "{'activation': 'gelu_tanh'}")} for i in range(2)},
        "the encoding your model returns": {pre},
    }
    assert len(report.diagnoses) == len(found)
    # The placement, written as a map file, keeps the padding row and leaves the positions the model's own.
    path = tmp_path / "map.json"
    path.write_text(json.dumps(mapping.as_map_file()))
    assert json.loads(path.read_text())["names"]["encoder.segment_embedding.weight"].endswith(".segment.weight[1:]")
    again = verify(torch_repo.build, EVEN, dtypes=["float64"], cases=["full_valid_len"], map_file=path)
    assert again.mapping.placements == mapping.placements


@runs_here("torch")
def test_the_command_gives_a_from_scratch_repositorys_bert_a_verdict_and_exit_1(capsys):
    argv = ["verify", "tests/subjects/torch_repo.py:build", "--config", "tiny", "--dtypes", "float64"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "Traceback (most recent call last)" not in captured.out + captured.err
    last = captured.out.strip().splitlines()[-1]
    assert last.startswith("FAIL: torch_repo.py:build first diverges at embedding (yours: ")
    assert last.endswith("the next-sentence classifier: it reads the pooler, which is not checked.")


@runs_here("torch")
def test_a_tutorials_layers_made_inside_forward_and_its_bare_ffn_are_each_named(tmp_path):
    """Weights made anew on every call are found where the forward uses them (placed there, never set), the
    two runs that differ are put down to them, not to dropout, and the FFN returned without its residual and
    LayerNorm is named in each block; the float32-only model is set up in float32."""
    report = verify(torch_tutorial.build, ODD, dtypes=["float32"], cases=WHOLE_LENGTHS, label="tutorial")
    mapping = report.mapping
    assert mapping.user_name("encoder.blks.1.attention.W_o.weight") == "layers.1.attn (made in forward: 4)"
    assert mapping.user_name("encoder.blks.0.addnorm1.ln.bias") == "layers.0 (made in forward: 3)"
    assert "8 at weights your forward makes anew on every call (never set)" in mapping.how
    assert "none of yours for encoder.blks.0.addnorm2.ln.weight" in mapping.how
    assert report.activations["blks.0.attention"] == "layers.0.attn (output)"
    assert report.activations["blks.0.output"] == "layers.0.ff2 (output)"  # no LayerNorm: the FFN's output
    found = [(d.mistake.name, d.where) for d in report.diagnoses if d.mistake]
    assert found == [
        ("layers_in_forward", "layers.0.attn"),
        ("sublayer_unwrapped", "layers.0.ff2"),
        ("sublayer_unwrapped", "layers.1.ff2"),
    ]
    assert "(layers.0, layers.0.attn, layers.1, layers.1.attn)" in report.diagnoses[0].describe()
    assert "dropout" not in report.verdict() and not report.passed
    # Its placement as a map file: what its forward makes is none of its parameters, so found again.
    path = tmp_path / "map.json"
    path.write_text(json.dumps(mapping.as_map_file()))
    assert not any("made in forward" in rule for rule in json.loads(path.read_text())["names"].values())
    again = verify(torch_tutorial.build, ODD, dtypes=["float32"], cases=["full_valid_len"], map_file=path)
    assert again.mapping.placements == mapping.placements


# --- Flax's own blocks -------------------------------------------------------------------------------------


@runs_here("jax")
def test_a_port_on_flaxs_own_blocks_is_placed_without_a_map_and_each_default_named(tmp_path):
    """Flax's attention (``nn.MultiHeadDotProductAttention``) keeps its kernels with the heads as an axis of
    their own; its LayerNorm's epsilon (1e-6) differs from the original BERT's at every LayerNorm, its GELU
    is the tanh approximation in the FFN and, with the epsilon, in the masked LM's transform: one module,
    two mistakes at once."""
    from subjects import flax_native

    report = verify(flax_native.build, ODD.with_semantics("bert"), dtypes=["float64"])
    assert report.mapping.how == "order of use and shape (46 tensors, inferred: check them)"
    placed = {
        name: report.mapping.user_name(name)
        for name in ("encoder.blks.0.attention.W_q.weight", "encoder.blks.1.attention.W_o.bias")
    }
    assert placed == {
        "encoder.blks.0.attention.W_q.weight": "Block_0.MultiHeadDotProductAttention_0.query.kernel.T",
        "encoder.blks.1.attention.W_o.bias": "Block_1.MultiHeadDotProductAttention_0.out.bias",
    }
    said = {diagnosis.where: diagnosis.says() for diagnosis in report.diagnoses}
    eps = "computes LayerNorm with eps 1e-06; bert's eps is 1e-12"
    gelu = "uses GELU (tanh approximation) where bert uses GELU (erf)"
    layer_norms = ["LayerNorm_0"] + [f"Block_{i}.LayerNorm_{j}" for i in range(2) for j in range(2)]
    assert said == {
        **dict.fromkeys(layer_norms, eps),
        **dict.fromkeys(["Block_0.Dense_0", "Block_1.Dense_0"], gelu),
        "the masked-LM output your model returns": f"{gelu}; it {eps}",
    }
    assert all(diagnosis.error < 1e-12 for diagnosis in report.diagnoses)
    assert report.verdict() == (
        "FAIL: build first diverges at embedding (yours: LayerNorm_0 (output)), case mixed_valid_lens, float64 "
        f"on cpu: it {eps}."
    )
    # The placement, written as a map file, reshapes the kernels as written.
    path = tmp_path / "map.json"
    path.write_text(json.dumps(report.mapping.as_map_file()))
    again = verify(
        flax_native.build, ODD.with_semantics("bert"), dtypes=["float64"], cases=["full_valid_len"], map_file=path
    )
    assert again.mapping.placements == report.mapping.placements and again.mapping.how == f"map file {path}"


# A from-scratch BERT in each framework that has no BERT blocks of its own: names as its author chose them.
SCRATCH = {"flax_scratch": ("jax", "block{i}.", "attn.q", "attn.o", "ln{k}", "fc2"),
           "gluon_scratch": ("mxnet", "blocks.{i}.", "attn.q", "attn.o", "ln{k}", "fc2")}  # fmt: skip


@pytest.mark.parametrize("subject", sorted(SCRATCH))
def test_a_from_scratch_bert_of_another_framework_has_each_difference_named_at_its_module(subject):
    """Pre-norm blocks of the framework's own LayerNorm (eps 1e-6) and the tanh GELU, a fixed sinusoidal
    table, no heads: each module read from what it was given (what a LayerNorm reads is recorded too, in
    each framework), each difference named."""
    backend, block, query, out, norm, ffn = SCRATCH[subject]
    if not_in_process(backend):
        pytest.skip(str(not_in_process(backend)))
    factory = importlib.import_module(f"subjects.{subject}").build
    report = verify(factory, EVEN, dtypes=["float64"], cases=WHOLE_LENGTHS)
    assert report.config.heads == () and "none of yours for encoder.pos_embedding" in report.mapping.how
    found = {d.where: {m.name for m, _ in ((d.mistake, d.rule), *d.also)} for d in report.diagnoses if d.mistake}
    first, second = block.format(i=0), block.format(i=1)
    assert found == {
        f"the input of {first}{query}": {"fixed_positions", "pre_norm", "layer_norm_eps"},
        f"{second}{out}": {"pre_norm"},
        **{f"{block.format(i=i)}{norm.format(k=k)}": {"pre_norm", "layer_norm_eps"} for i in range(2) for k in (1, 2)},
        **{f"{block.format(i=i)}{ffn}": {"pre_norm", "activation"} for i in range(2)},
        "the encoding your model returns": {"pre_norm"},
    }
    assert all(d.error < 1e-12 for d in report.diagnoses) and len(report.diagnoses) == len(found)
