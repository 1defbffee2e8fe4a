"""``bert-multi verify`` on users' own models in each framework: ports with their own names and order, a
fused QKV, a wrapper's prefix, d2l's drop-in classes of every generation, transformers' BERT, and the
fault catalogue planted in them, each caught and named where it lives."""

import functools
import json
import os
import re
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest

from bert_multi import CONFIGS, UsageError, verify
from bert_multi.backend.registry import not_in_process
from bert_multi.testing import assert_model_conforms
from bert_multi.verify.map_file import MapFile
from bert_multi.verify.mapping import MappingError
from conftest import runs_here

ROOT = Path(__file__).resolve().parent.parent
SUBJECTS = Path(__file__).resolve().parent / "subjects"
TINY = CONFIGS["tiny"]


# --- PyTorch ---------------------------------------------------------------------------------------------


@runs_here("torch")
def test_a_port_with_its_own_names_conforms_forward_gradients_and_loss():
    from subjects import torch_port

    report = verify(torch_port.build, TINY, gradients=True, loss=torch_port.fixed_batch_loss)
    assert report.passed, report.failures()
    assert report.mapping.how == "order of use and shape (45 tensors, inferred: check them)"
    assert report.activations["blks.1.attention"] == "layers.1.attn.out (output)"
    assert report.activations["embedding"] == "layers.0.attn.query (input)"
    assert len(report.forward.checks) == 2 * 10 and all(check.intermediates for check in report.forward.checks)


@runs_here("torch")
@pytest.mark.parametrize("fault", ["scale", "inf_mask", "tiled_valid_lens"])
def test_each_forward_fault_is_caught_at_the_attention_in_the_users_names(fault):
    from subjects import torch_port

    report = verify(functools.partial(torch_port.make, fault=fault), TINY, label=fault, dtypes=["float64"])
    assert not report.passed
    assert report.verdict().startswith(f"FAIL: {fault} first diverges at blks.0.attention (yours: layers.0.attn.out")


# Each of the catalogue's mistakes as the port makes it: what the diagnosis must say of it.
DIAGNOSED = {
    "scale": ("score_scale", "layers.0.attn.out divides the scores by sqrt(12), the full width, where d2l divides by "
                             "sqrt(4), the width of a head"),
    "unscaled": ("score_scale", "does not scale the scores"),
    "inf_mask": ("mask_fill", "fills the masked scores with -inf where d2l uses -1e6"),
    "zero_fill": ("mask_fill", "fills the masked scores with 0 where d2l uses -1e6"),
    "token_mask": ("mask_from_tokens", "layers.0.attn.out masks the keys whose token id is 0"),
    "tiled_valid_lens": ("tiled_valid_lens", "tiles valid_lens over the heads"),
    "eps": ("layer_norm_eps", "layers.0.norm1 computes LayerNorm with eps 1e-12; d2l's eps is 1e-05"),
    "gelu": ("activation", "layers.0.down uses GELU (erf) where d2l uses ReLU"),
    "no_bias": ("attention_bias", "computes W_q, W_k, W_v and W_o without biases"),
    "transposed_query": ("transposed_weight", "uses W_q transposed"),
    "pre_norm": ("pre_norm", "the input of layers.0.attn.query normalises the block's input before the attention"),
    "ffn_unwrapped": ("sublayer_unwrapped", "layers.0.down returns its sublayer's output with no residual connection "
                                            "and no LayerNorm around it"),
    "positions_offset": ("positions_offset", "counts the positions from 1, where d2l counts from 0"),
    "sinusoidal": ("fixed_positions", "adds a fixed sinusoidal table for the positions (a buffer, as the "
                                      "Transformer's) where d2l learns them"),
    "no_segments": ("segments_ignored", "leaves the segment embedding out of the embedding sum"),
    "last_position": ("pooler_position", "the input of nsp_out pools the last position"),
    "no_tanh": ("pooler_activation", "the input of nsp_out uses no activation after the pooler's dense layer where "
                                     "d2l uses tanh"),
    "dropout_on": ("dropout_at_inference", "layers.0.attn.out leaves dropout on at inference"),
    "additive_mask": ("additive_mask", "layers.0.attn.out adds -10000 to the masked scores (an additive mask)"),
    "mask_le": ("mask_off_by_one", "layers.0.attn.out attends to one key past each valid length"),
    "softmax_queries": ("softmax_axis", "layers.0.attn.out normalises the attention weights over the queries"),
    "view_heads": ("heads_reshaped", "layers.0.attn.out splits the heads by a reshape alone"),
    "empty_rows_zero": ("masked_rows_zero", "layers.0.attn.out gives a row whose every key is masked no attention"),
    "padded_zero": ("padded_positions_zero", "the encoding your model returns returns zeros at the padded positions"),
    "std_eps": ("layer_norm_form", "layers.0.norm1 computes LayerNorm as (x - mean) / (std + eps) with the unbiased "
                                   "standard deviation, eps 1e-06"),
}  # fmt: skip


def test_the_ports_faults_cover_the_whole_catalogue():
    from bert_multi.verify.mistakes import MISTAKES

    assert {mistake for mistake, _ in DIAGNOSED.values()} == set(MISTAKES)


@pytest.mark.once  # the page read as text
def test_the_verify_page_lists_every_mistake_the_diagnosis_can_name():
    from bert_multi.verify.mistakes import FLOAT32_INSIDE, LAYERS_IN_FORWARD, MISTAKES, PARAMETERS_CHANGED

    page = (Path(__file__).parent.parent / "docs" / "verify.md").read_text()
    table = page[page.index("| mistake | what is tried |") :].split("\n\n")[0]
    listed = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    assert len(listed) == len(set(listed))
    assert set(listed) == {*MISTAKES, LAYERS_IN_FORWARD.name, PARAMETERS_CHANGED.name, FLOAT32_INSIDE.name}


@runs_here("torch")
def test_a_module_that_rounds_to_float32_in_a_float64_run_is_named_as_such():
    """Off d2l's rule by float32's rounding, which no change of the catalogue's reproduces: the module (here
    the FFN's, where a ``.float()`` was left) computes part of its work in float32; the float32 run passes."""
    from subjects import torch_port

    factory = functools.partial(torch_port.make, fault="float32_hidden")
    report = verify(factory, TINY, dtypes=["float64"], label="float32_hidden")
    said = [(d.mistake.name, d.where) for d in report.diagnoses if d.mistake is not None]
    assert said and all(name == "float32_inside" for name, _ in said) and said[0][1] == "layers.0.down"
    assert len(said) == len(report.diagnoses) and all(1e-9 < d.off < 1e-5 for d in report.diagnoses)
    assert verify(factory, TINY, dtypes=["float32"], label="float32_hidden").passed


@runs_here("torch")
@pytest.mark.parametrize("fault", sorted(DIAGNOSED))
def test_each_mistake_of_a_port_is_named_at_its_module_with_its_numbers(fault):
    from subjects import torch_port

    report = verify(functools.partial(torch_port.make, fault=fault), TINY, label=fault, dtypes=["float64"])
    mistake, said = DIAGNOSED[fault]
    first = report.diagnoses[0]
    assert first.mistake is not None and first.mistake.name == mistake, first.describe()
    assert said in first.describe() and first.mistake.says(first.rule, TINY) in report.verdict()
    if mistake != "dropout_at_inference":  # reproduced from the module's own input, to float64's rounding
        assert first.error < 1e-13 and f"(reproduces your output to {first.error:.1g})" in first.describe()


@runs_here("torch")
def test_a_forward_that_changes_its_parameters_is_said_to_and_never_taken_for_dropout():
    from subjects import torch_port

    report = verify(functools.partial(torch_port.make, fault="updates_weights"), TINY, dtypes=["float64"])
    first = report.diagnoses[0]
    assert first.mistake is not None and first.mistake.name == "parameters_changed", first.describe()
    assert "changes its own parameters when it runs (layers.0.attn.out.weight, layers.1.attn.out.weight)" in (
        first.describe()
    )
    assert "dropout" not in report.verdict()


@runs_here("torch")
def test_a_mistake_the_catalogue_does_not_know_is_said_so_with_the_numbers():
    from subjects import torch_port

    report = verify(functools.partial(torch_port.make, fault="ffn_doubled"), TINY, dtypes=["float64"])
    # The doubling is after the FFN's last layer: the residual's sum shows it, in each block (every module that
    # differs itself is named, each from its own input).
    diagnosis, second = report.diagnoses
    assert diagnosis.mistake is None and diagnosis.activation == "blks.0.output"
    assert second.mistake is None and second.activation == "blks.1.output" and second.where == "layers.1.norm2"
    text = diagnosis.describe()
    assert text.startswith("layers.0.norm2: no known mistake reproduces its output (d2l's rule is off by ")
    assert (
        "; the closest known mistake, that it " in text
        and "its input is yours, so the difference is in this module" in text
    )
    # Each number where it belongs: d2l's own distance, then the closest mistake's (they differ here).
    off, closest = f"{diagnosis.off:.3g}", f"{diagnosis.error:.3g}"
    assert off != closest and f"(d2l's rule is off by {off}; the closest known mistake" in text
    assert text.endswith(f", is off by {closest}); its input is yours, so the difference is in this module")
    assert "{" not in text  # plain words, no rule as a dict
    assert report.verdict().endswith("float64 on cpu.")  # no mistake named where none fits


@runs_here("torch")
def test_a_head_that_computes_something_else_is_named_by_its_module_and_the_others_still_decide_the_roles():
    """The port runs the NSP classifier before the masked LM, so order of use takes the pooler for the masked
    LM's first dense layer; its masked LM divides by a temperature no catalogue knows. The pooler, which
    d2l's rule reproduces, decides the roles alone, and the masked LM is named by the port's module."""
    from subjects import torch_heads

    report = verify(functools.partial(torch_heads.build, temperature=0.5), TINY, label="heads", dtypes=["float64"])
    assert report.mapping.how.endswith(
        "+ the oracle placed mlm.mlp.0 at lm.0.weight, hidden.0 at pooler.0.weight (from pooler alone: no "
        "assignment reproduces mlm)"
    )
    assert {check.name for check in report.forward.checks[0].outputs if not check.passed} == {"mlm"}
    assert (
        report.verdict()
        == "FAIL: heads first diverges at mlm (yours: lm (output)), case mixed_valid_lens, float64 on cpu."
    )
    assert report.diagnoses[0].describe().startswith("lm: no known mistake reproduces its output")


@runs_here("torch")
def test_alike_modules_placed_by_order_are_decided_by_the_oracle():
    """A port that keeps its projections as bare (in, out) matrices in one module and computes the keys
    first: neither names, nor shapes, nor the order tell W_q from W_k or which way round the matrices are.
    The oracle decides, from the recorded input of the attention; where the attention computes something
    else (scores scaled by the full width), it cannot, and says so."""
    from subjects import torch_matrices

    report = verify(torch_matrices.build, TINY, gradients=True)
    assert report.passed, report.failures()
    assert "the oracle placed encoder.blks.0.attention.W_q at blocks.0.attention.wq.T, " in report.mapping.how
    assert report.mapping.user_name("encoder.blks.1.attention.W_k.weight") == "blocks.1.attention.wk.T"
    # A known mistake there: the roles decided allowing for it, and the mistake named.
    faulty = verify(torch_matrices.build_faulty, TINY, dtypes=["float64"])
    assert "W_o at blocks.1.attention.wo.T (allowing for its score_scale, diagnosed below)" in faulty.mapping.how
    assert faulty.verdict().endswith("it divides the scores by sqrt(12), the full width, where d2l divides by "
                                     "sqrt(4), the width of a head.")  # fmt: skip


@runs_here("torch")
def test_alike_modules_the_oracle_cannot_tell_apart_keep_their_order_and_say_so(monkeypatch):
    from subjects import torch_matrices

    forward = torch_matrices.Attention.forward
    monkeypatch.setattr(torch_matrices.Attention, "forward", lambda self, x, lens: 2 * forward(self, x, lens) + 1)
    report = verify(torch_matrices.build, TINY, dtypes=["float64"])
    assert "the oracle could not confirm which of blocks.0.attention, blocks.0.attention, " in report.mapping.how
    assert report.mapping.user_name("encoder.blks.0.attention.W_q.weight") == "blocks.0.attention.wk"  # as used


@runs_here("torch")
def test_detached_positions_conform_forward_but_not_in_gradients_unless_stated_frozen():
    from subjects import torch_port

    model = functools.partial(torch_port.make, fault="detached_positions")
    report = verify(model, TINY, dtypes=["float64"], gradients=True, label="detached")
    assert report.forward.passed and not report.passed
    assert report.verdict() == (
        "FAIL: detached's outputs conform, but its gradient of the random projection does not, at positions: no "
        "gradient reaches it."
    )
    assert report.gradients[0].causes == {"encoder.pos_embedding": "backward"}  # nothing else differs
    assert verify(model, TINY, dtypes=["float64"], gradients=True, frozen=["positions"]).passed


@runs_here("torch")
def test_gradients_are_put_down_to_modules_only_where_every_activation_was_located(monkeypatch):
    """Blame needs every module's input and output made the oracle's; with one block's FFN not located, a
    module-by-module blame would be made on a mix of the oracle's and the model's own values: none is made."""
    from subjects import torch_port

    from bert_multi.verify import session

    located = session.check_gradients

    def one_tap_short(*arguments):
        *rest, taps = arguments
        return located(*rest, OrderedDict((name, tap) for name, tap in taps.items() if name != "blks.1.ffn"))

    monkeypatch.setattr(session, "check_gradients", one_tap_short)
    model = functools.partial(torch_port.make, fault="relu_backward")
    report = verify(model, TINY, dtypes=["float64"], cases=["full_valid_len"], gradients=True, label="relu")
    assert report.forward.passed and not report.passed
    assert report.gradients and all(not check.passed and check.causes == {} for check in report.gradients)


@runs_here("torch")
def test_a_wrong_backward_is_named_at_its_module_and_what_it_carries_is_said_so():
    """A hand-written ReLU whose backward lets the gradient through where the input was negative: the
    outputs conform, and of every parameter whose gradient differs, only those of the layer before the ReLU
    are wrong when each module is checked alone, fed the oracle's input and output gradient."""
    from subjects import torch_port

    from bert_multi.verify.subject import activation_of

    model = functools.partial(torch_port.make, fault="relu_backward")
    report = verify(model, TINY, dtypes=["float64"], cases=["full_valid_len"], gradients=True, label="relu")
    assert report.forward.passed and not report.passed
    for check in report.gradients:
        dense1 = {f"encoder.blks.{i}.ffn.dense1.{kind}" for i in range(TINY.num_blks) for kind in ("weight", "bias")}
        assert set(check.caused_by("backward")) == dense1 and not check.caused_by("forward")
        carried = check.caused_by("carried")
        assert "encoder.pos_embedding" in carried and "encoder.blks.0.attention.W_q.weight" in carried
        assert {activation_of(TINY, name) for name in carried} > {"embedding", "blks.0.attention"}
    assert report.verdict() == (
        "FAIL: relu's outputs conform, but its gradient of the random projection does not, at layers.0.up.weight: "
        "its module's own backward gives another gradient."
    )
    assert "the backward of blks.0.ffn (yours: layers.0.up), blks.1.ffn (yours: layers.1.up) is wrong on its own" in (
        report.failures()
    )
    causes = report.to_json()["gradients"][0]["causes"]
    assert (
        causes["layers.0.up.bias"] == "its module's backward alone gives another gradient (or none) from the oracle's"
    )


@runs_here("torch")
@pytest.mark.parametrize(
    "fault, modules",
    [("scale", ("attention",)), ("eps", ("addnorm1", "output"))],  # the port's MLM norm keeps d2l's eps
)
def test_gradient_differences_that_follow_from_a_forward_divergence_are_put_down_to_it(fault, modules):
    """Scores scaled by the full width, a LayerNorm eps of 1e-12: every gradient differs, and checked module
    by module only those of the modules computing other values do; the positions' are carried, not first."""
    from subjects import torch_port

    from bert_multi.verify.subject import activation_of

    model = functools.partial(torch_port.make, fault=fault)
    report = verify(model, TINY, dtypes=["float64"], cases=["full_valid_len"], gradients=True)
    for check in report.gradients:
        assert {activation_of(TINY, name) for name in check.caused_by("forward")} == {
            f"blks.{i}.{module}" for i in range(TINY.num_blks) for module in modules
        }
        assert not check.caused_by("backward") and "encoder.pos_embedding" in check.caused_by("carried")


@runs_here("torch")
def test_d2ls_loss_with_a_mean_reducing_loss_object_fails_and_says_why():
    from subjects import torch_port

    report = verify(torch_port.build, TINY, dtypes=["float64"], loss=torch_port.d2l_batch_loss)
    assert report.forward.passed and not report.passed
    assert "padding included" in report.loss.diagnosis and "2582" in report.loss.diagnosis
    stated = verify(
        torch_port.build, TINY, dtypes=["float64"], loss=torch_port.d2l_batch_loss, mlm_normalization="all_slots"
    )
    assert stated.passed


@runs_here("torch")
def test_a_fused_qkv_is_placed_by_a_map_file(tmp_path):
    from subjects import torch_port

    (tmp_path / "map.json").write_text(json.dumps(torch_port.FUSED_MAP))
    report = verify(torch_port.build_fused, TINY, gradients=True, map_file=tmp_path / "map.json")
    assert report.passed, report.failures()
    assert report.mapping.placements["encoder.blks.1.attention.W_k.bias"].describe() == "layers.1.attn.qkv.bias[1/3]"


@runs_here("torch")
def test_d2ls_classes_under_a_wrappers_prefix_are_found_by_name():
    from subjects import torch_port

    report = verify(torch_port.build_wrapped_d2l, TINY, gradients=True)
    assert report.passed and report.mapping.how == "names (d2l >= 0.12's PyTorch names, under the prefix 'module.')"


@runs_here("torch")
def test_verifying_a_pytorch_model_imports_no_other_framework():
    """A user's pytest run of their PyTorch port sees none of MXNet's deprecation warnings: nothing of
    another framework's can be in a process that never imported it, so its backend is not loaded."""
    script = (
        f"import sys; sys.path.insert(0, {str(SUBJECTS)!r})\nimport torch_port\nfrom bert_multi import verify\n"
        "assert verify(torch_port.build, 'tiny', dtypes=['float64']).passed\n"
        "print(sorted(name for name in ('mxnet', 'jax', 'flax', 'transformers') if name in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


@runs_here("torch")
def test_a_model_object_is_copied_not_changed():
    import torch
    from subjects import torch_port

    model = torch_port.build(TINY)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert verify(model, TINY, gradients=True).passed  # each dtype's model is a copy holding the canonical weights
    assert all(torch.equal(before[name], p) and p.dtype == torch.float32 for name, p in model.named_parameters())


@pytest.mark.cuda
@runs_here("torch")
def test_a_port_on_the_gpu_conforms_and_its_gradients_match_there(tmp_path):
    import torch
    from subjects import torch_port

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to PyTorch here")
    report = verify(torch_port.build, TINY, devices=["cpu", "cuda"], gradients=True)
    assert report.passed, report.failures()
    assert {check.device for check in report.gradients} == {"cpu", "cuda"}
    assert any("via" in check.reference and check.target.device == "cuda" for check in report.forward.checks)


# --- every generation's drop-in classes, in both frameworks ---------------------------------------------

GENERATIONS = [("d2l_0_11", "d2l-0.11"), ("d2l_0_12", "d2l-0.12"), ("d2l_0_17", "d2l")]


def _drop_in(framework, module, config):
    import importlib

    d2l = importlib.import_module(f"bert_multi.{framework}.{module}")
    V, H, F, heads, L, dropout, max_len = config.d2l_args()
    if framework == "torch" and module == "d2l_0_17":  # 0.17's PyTorch signature spells out every width
        return d2l.BERTModel(V, H, [H], H, F, heads, L, dropout, max_len, H, H, H, H, H, H)
    return d2l.BERTModel(V, H, F, heads, L, dropout, max_len)


@pytest.mark.parametrize("framework", [pytest.param(name, marks=runs_here(name)) for name in ("torch", "mxnet", "jax")])
@pytest.mark.parametrize("module, preset", GENERATIONS)
def test_the_drop_in_classes_of_every_generation_conform(framework, module, preset):
    config = TINY.with_semantics(preset)
    factory = functools.partial(_drop_in, framework, module)
    # d2l 0.16-0.17's PyTorch code added pos_embedding.data: its positions never trained.
    frozen = ["encoder.pos_embedding"] if (framework, module) == ("torch", "d2l_0_17") else []
    report = verify(factory, config, gradients=True, frozen=frozen, label=f"{framework}.{module}")
    assert report.passed, report.failures()
    family = {"torch": "PyTorch", "mxnet": "Gluon", "jax": "Flax"}[framework]
    assert report.mapping.how.startswith("names (d2l") and family in report.mapping.how
    if frozen:
        assert not verify(factory, config, dtypes=["float64"], gradients=True).passed


# --- Gluon ----------------------------------------------------------------------------------------------


@runs_here("mxnet")
def test_a_gluon_port_with_deferred_shapes_conforms_forward_gradients_and_loss():
    from subjects import gluon_port

    report = verify(gluon_port.build, TINY, gradients=True, loss=gluon_port.d2l_batch_loss)
    assert report.passed, report.failures()
    # Held to the oracle at Gluon's own LayerNorm eps (a C float), which alone moves gradients by 6e-11.
    assert report.forward.checks[0].reference == "oracle (LayerNorm eps 9.99999975e-06)"
    assert max(c.max_abs for check in report.gradients for c in check.comparisons) < 1e-12
    assert report.activations["blks.0.output"] == "layers.0.norm2 (output)"


@runs_here("mxnet")
def test_a_fault_in_a_gluon_port_is_named_in_its_names():
    from subjects import gluon_port

    report = verify(gluon_port.build_faulty, TINY, dtypes=["float64"])
    expected = "FAIL: build_faulty first diverges at blks.0.attention (yours: layers.0.attn.out"
    assert report.verdict().startswith(expected)


# --- Flax -------------------------------------------------------------------------------------------------


@runs_here("jax")
@pytest.mark.parametrize("factory", ["build", "build_bound"])
def test_a_flax_port_given_with_its_variables_or_bound_conforms_forward_and_gradients(factory):
    from subjects import flax_port

    report = verify(getattr(flax_port, factory), TINY, gradients=True)
    assert report.passed, report.failures()
    # Its (in, out) kernels were found transposed, by registration order and shape.
    assert report.mapping.placements["encoder.blks.0.ffn.dense1.weight"].describe() == "layer0.up.kernel.T"
    assert report.activations["embedding"] == "layer0.attn.query (input)"
    assert report.activations["blks.0.output"] == "layer0.norm2 (output)"
    assert max(c.max_abs for check in report.gradients for c in check.comparisons) < 1e-12


@runs_here("jax")
def test_an_nnx_port_conforms_forward_and_gradients_and_is_left_as_it_was():
    """Flax's NNX API: a module that holds its parameters, put in inference mode by ``eval()``, its layers'
    own dtypes (``nnx.Embed`` keeps float32) cast as torch's ``.to`` casts; a copy runs, never the user's."""
    import jax
    from flax import nnx
    from subjects import flax_nnx

    built = []

    def factory(config):
        built.append(flax_nnx.build(config))
        return built[-1]

    report = verify(factory, TINY, gradients=True)
    assert report.passed, report.failures()
    assert report.mapping.placements["encoder.blks.1.attention.W_k.weight"].describe() == "blocks.1.key.kernel.T"
    assert report.mapping.placements["encoder.pos_embedding"].describe() == "positions"
    assert report.activations["blks.0.output"] == "blocks.0.norm2 (output)"
    assert max(c.max_abs for check in report.gradients for c in check.comparisons) < 1e-12
    fresh = nnx.to_pure_dict(nnx.state(flax_nnx.build(TINY), nnx.Param))
    # The classes whose calls were reported while a forward was traced have their own __call__ back.
    for cls in (flax_nnx.Block, flax_nnx.NnxBERT, nnx.Linear, nnx.LayerNorm, nnx.Embed, nnx.Dropout):
        assert vars(cls)["__call__"].__qualname__ == f"{cls.__name__}.__call__"
    for model in built:  # one a dtype
        assert model.blocks[0].drop.deterministic is False and model.tokens.dtype == jax.numpy.float32
        params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), params, fresh))


@runs_here("jax")
def test_an_nnx_port_on_flaxs_own_attention_is_float32_accurate_there_and_said_so():
    """``nnx.MultiHeadAttention`` (no attention dropout) computes through ``jax.nn.dot_product_attention``,
    whose softmax is float32: the float64 run is off by float32's rounding at each attention, and says so;
    the float32 run passes. Flax's 4-D kernels are placed without a map."""
    from subjects import flax_nnx

    report = verify(flax_nnx.build_on_flax_attention, TINY)
    placed = report.mapping.placements["encoder.blks.0.attention.W_q.weight"].describe()
    assert placed == "blocks.0.attention.query.kernel.T"
    said = [(d.mistake.name, d.where) for d in report.diagnoses if d.mistake is not None]
    assert said == [("float32_inside", f"blocks.{i}.attention.out") for i in range(TINY.num_blks)]
    assert {check.target.dtype for check in report.forward.failures()} == {"float64"}
    assert "as jax.nn.dot_product_attention's softmax does" in report.verdict()


@runs_here("jax")
def test_an_nnx_port_on_flaxs_default_epsilon_is_named_at_each_layer_norm():
    from subjects import flax_nnx

    report = verify(flax_nnx.build_default_eps, TINY, dtypes=["float64"])
    said = [(d.mistake.name, d.where) for d in report.diagnoses if d.mistake is not None]
    assert said == [("layer_norm_eps", f"blocks.{i}.norm{j}") for i in range(TINY.num_blks) for j in (1, 2)]
    assert report.verdict().endswith("it computes LayerNorm with eps 1e-06; d2l's eps is 1e-05.")


@runs_here("jax")
def test_a_fault_in_a_flax_port_is_named_in_its_names():
    from subjects import flax_port

    report = verify(flax_port.build_faulty, TINY, dtypes=["float64"])
    assert report.verdict().startswith("FAIL: build_faulty first diverges at blks.0.attention (yours: layer0.attn.out")


@runs_here("jax")
def test_a_wrong_backward_in_a_flax_port_is_named_at_its_module():
    """``jax.custom_vjp`` with a wrong backward: checked alone, Flax modules are fed the oracle's arrays by
    method interception, so the Dense layer before it is named and every other difference is carried."""
    from subjects import flax_port

    report = verify(flax_port.build_wrong_backward, TINY, dtypes=["float64"], cases=["full_valid_len"], gradients=True)
    assert report.forward.passed and not report.passed
    dense1 = {f"encoder.blks.{i}.ffn.dense1.{kind}" for i in range(TINY.num_blks) for kind in ("weight", "bias")}
    for check in report.gradients:
        assert set(check.caused_by("backward")) == dense1 and not check.caused_by("forward")
        assert "encoder.pos_embedding" in check.caused_by("carried")
    assert report.verdict().endswith(
        "does not, at layer0.up.kernel.T: its module's own backward gives another gradient."
    )


@runs_here("jax")
def test_a_notebooks_flax_port_is_placed_without_a_map_and_its_epsilon_named(tmp_path):
    """The chapter ported to Flax as a notebook would: d2l's class names, ``nn.LayerNorm()``'s own epsilon
    (1e-6), the masked LM's MLP as an ``nn.Sequential``, the positions created first, the masked LM called
    before the pooler, dropout 0.2 and ``train=True`` by default."""
    from subjects import flax_notebook

    report = verify(flax_notebook.build, TINY, dtypes=["float64"], cases=["full_valid_len"], gradients=True)
    assert report.mapping.how == (
        "names (d2l >= 0.12's Flax names: 37 tensors) + order of use and shape (8 tensors, inferred: check them)"
    )
    placed = {name: report.mapping.user_name(name) for name in ("mlm.mlp.0.weight", "hidden.0.weight")}
    assert placed == {"mlm.mlp.0.weight": "mlm.mlp.layers_0.kernel.T", "hidden.0.weight": "hidden.kernel.T"}
    assert report.verdict() == (
        "FAIL: build first diverges at blks.0.addnorm1 (yours: encoder.blks_0.addnorm1.ln (output)), case "
        "full_valid_len, float64 on cpu: it computes LayerNorm with eps 1e-06; d2l's eps is 1e-05."
    )
    # Its gradients differ everywhere; checked module by module, at the LayerNorms' weights (and its MLM
    # head's, whose LayerNorm has eps 1e-6 too), the positions' carried from them.
    from bert_multi.verify.subject import activation_of

    for check in report.gradients:
        assert {activation_of(TINY, name) for name in check.caused_by("forward")} == {
            "blks.0.addnorm1", "blks.0.output", "blks.1.addnorm1", "blks.1.output", "mlm"
        }  # fmt: skip
        assert not check.caused_by("backward") and "encoder.pos_embedding" in check.caused_by("carried")
    # The placement written as a map file works as written.
    path = tmp_path / "map.json"
    path.write_text(json.dumps(report.mapping.as_map_file()))
    again = verify(flax_notebook.build, TINY, dtypes=["float64"], cases=["full_valid_len"], map_file=path)
    assert again.mapping.placements == report.mapping.placements and again.mapping.how == f"map file {path}"


@runs_here("jax")
def test_a_flax_model_that_cannot_be_put_in_inference_mode_is_one_clear_line():
    from flax import linen as nn
    from subjects import flax_notebook

    class AlwaysTraining(nn.Module):  # its call takes no flag: dropout is always on
        inner: nn.Module

        def __call__(self, tokens, segments, valid_lens=None, pred_positions=None):
            return self.inner(tokens, segments, valid_lens, pred_positions, train=True)

    def build(config):
        module, _ = flax_notebook.build(config)
        return AlwaysTraining(module)

    with pytest.raises(UsageError, match=r"draws random numbers in its forward \(dropout left on\?\)") as caught:
        verify(build, TINY, dtypes=["float64"])
    assert "Traceback" not in str(caught.value) and "\n" not in str(caught.value)


@runs_here("jax")
def test_a_loss_for_a_flax_model_is_refused_before_any_work():
    from subjects import flax_notebook, torch_port

    with pytest.raises(UsageError, match="--loss needs d2l's loss in your model's framework; Flax"):
        verify(flax_notebook.build, TINY, loss=torch_port.d2l_batch_loss, progress=_no_progress)


def _no_progress(done, planned, label):
    raise AssertionError(f"work started ({label}) before the refusal")


# --- transformers ---------------------------------------------------------------------------------------


@runs_here("transformers")
def test_a_transformers_bert_conforms_to_the_original_bert():
    from subjects import hf_port

    report = verify(hf_port.build, TINY.with_semantics("bert"), gradients=True)
    assert report.passed, report.failures()
    assert report.mapping.how == "names (transformers' names, under the prefix 'model.')"
    assert report.activations["blks.0.addnorm1"] == "model.bert.encoder.layer.0.attention.output.LayerNorm (output)"


@runs_here("transformers")
@pytest.mark.parametrize(
    "name, checked",
    [
        ("BertModel", {"pooler"}),
        ("BertForMaskedLM", {"mlm"}),
        ("BertForNextSentencePrediction", {"pooler", "nsp"}),
        ("BertForSequenceClassification", {"pooler"}),
        ("BertForQuestionAnswering", set()),  # built without a pooler
    ],
)
def test_transformers_other_bert_classes_are_verified_on_the_parts_d2ls_bert_has(name, checked):
    """Each class's heads read from its own outputs (``logits`` is the masked LM's in one, the next-sentence
    classifier's in another), and a BertModel's pooler at its own output; a class fine-tuned for a task is
    verified on its BertModel, its task head never taken for d2l's next-sentence classifier, and the report
    says the head was left out. Every class is placed by transformers' names, with or without ``bert.``."""
    from subjects import hf_port

    report = verify(functools.partial(hf_port.build_class, name=name), TINY.with_semantics("bert"), label=name)
    assert report.passed, report.failures()
    assert {"pooler", "mlm", "nsp"} - set(report.absent) == checked
    assert re.fullmatch(r"names \(transformers' (BertModel )?names, under the prefix 'model\.'\)", report.mapping.how)
    assert ("pooler" in report.activations) == ("pooler" in checked)
    framework = str(next(iter(report.forward.runtime.values()))["framework"])
    assert ("without its task head" in framework) == name.endswith(("Classification", "Answering"))


@runs_here("transformers")
@pytest.mark.parametrize("activation, named", [("Identity", "no activation"), ("ReLU", "ReLU")])
def test_a_transformers_bertmodels_pooler_is_checked_at_its_own_output(activation, named):
    # Nothing reads a BertModel's pooler: it is observed at BertPooler's output, its tanh included.
    from subjects import hf_port
    from torch import nn

    def build(config):
        model = hf_port.build_class(config, "BertModel")
        model.pooler.activation = getattr(nn, activation)()
        return model

    report = verify(build, TINY.with_semantics("bert"), dtypes=["float64"])
    expected = (
        f"first diverges at pooler (yours: model.pooler (output)), case mixed_valid_lens, float64 on cpu: it uses "
        f"{named} after the pooler's dense layer where bert uses tanh; not checked: the masked-LM head"
    )
    assert expected in report.verdict()


def _without_nsp(fault=None, pooler_module=False):
    """A factory of torch_port's model without its NSP classifier; ``pooler_module``: its pooler a module of
    its own, the dense layer and its tanh (``pool``)."""
    from subjects import torch_port
    from torch import nn

    class WithoutNSP(torch_port.MyBERT):
        def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
            encoded, mlm, _ = super().forward(tokens, segments, valid_lens, pred_positions)
            return encoded, mlm, None

    def build(config):
        model = torch_port.make(config, fault)
        model.__class__, model.nsp_out = WithoutNSP, nn.Identity()
        if pooler_module:
            model.pool = nn.Sequential(model.pool, nn.Tanh())
        return model

    return build


@runs_here("torch")
def test_a_parameter_no_tensor_sets_is_refused_in_a_model_that_lacks_a_layernorm():
    # A LayerNorm left out is no part left out: the model's other parameters are still all accounted for.
    from subjects import torch_port
    from torch import nn

    def build(config):
        model = torch_port.make(config, "ffn_unwrapped")
        model.unused = nn.Linear(3, 3)
        return model

    with pytest.raises(MappingError, match=r"does not fit.*\['unused.weight', 'unused.bias'\]"):
        verify(build, TINY, dtypes=["float64"])


UNSEEN_POOLER = (
    "no NSP classifier reads it, and no module of your model is known to output it (a map file's pooler_output "
    "names one)"
)


@runs_here("torch")
@pytest.mark.parametrize("fault", [None, "last_position", "no_tanh"])
def test_a_pooler_that_nothing_reads_is_said_to_be_not_checked(fault):
    """A port without the NSP classifier: nothing the model gives shows its pooler, so the report says
    the pooler was not checked, whether it is right or wrong, never that it conforms."""
    report = verify(_without_nsp(fault), TINY, dtypes=["float64"])
    assert report.passed, report.failures()
    assert report.absent["pooler"] == UNSEEN_POOLER
    assert "pooler" not in report.activations and "hidden.0.weight" not in report.mapping.placements
    assert report.verdict().endswith(f"the pooler: {UNSEEN_POOLER}.")


@runs_here("torch")
def test_a_map_files_pooler_output_is_where_the_pooler_is_checked(tmp_path):
    # The same port with its pooler a module of its own: named by the map file, it is observed there.
    named = tmp_path / "map.json"
    named.write_text(json.dumps({"pooler_output": "pool"}))
    report = verify(_without_nsp(pooler_module=True), TINY, dtypes=["float64"], map_file=named)
    assert report.passed and "pooler" not in report.absent, report.failures()
    assert report.activations["pooler"] == "pool (output)"
    wrong = verify(_without_nsp("last_position", pooler_module=True), TINY, dtypes=["float64"], map_file=named)
    assert "first diverges at pooler (yours: pool (output))" in wrong.verdict()
    assert "it pools the last position where d2l pools <cls>" in wrong.verdict()
    with pytest.raises(UsageError, match=r"map.json: pooler_output 'pooler' is no module of your model \(its "
                       r"modules named like a pooler: \['pool'\]\)"):  # fmt: skip
        verify(_without_nsp(), TINY, dtypes=["float64"], map_file=MapFile({}, (), "map.json", pooler_output="pooler"))


@runs_here("transformers")
def test_transformers_padding_row_gets_no_gradient_and_verify_finds_it():
    # BertEmbeddings' padding_idx (pad_token_id, 0 by default) zeroes the gradient of that row: the
    # original BERT trains it. Invisible in every forward output.
    from subjects import hf_port

    report = verify(functools.partial(hf_port.build, pad_token_id=0), TINY.with_semantics("bert"), gradients=True)
    assert report.forward.passed and not report.passed
    first = report.gradients[0].first_divergence
    assert first.name == "encoder.token_embedding.weight" and first.worst_index[0] == 0
    # Its word embedding is tied to the decoder, so row 0 does get a gradient (the decoder's): it differs alone.
    table = "model.bert.embeddings.word_embeddings.weight"
    assert report.verdict().endswith(f"at {table}: only its row 0 differs (an embedding's padding_idx?).")
    assert f"only row 0 of {table} differs: an embedding built with padding_idx" in report.failures()


@runs_here("torch")
def test_a_ports_padding_row_is_said_to_be_the_one_row_that_differs():
    from subjects import torch_port

    def build(config):
        model = torch_port.make(config)
        model.tokens.padding_idx = 1  # as nn.Embedding(vocab, hidden, padding_idx=1) makes it
        return model

    report = verify(build, TINY, dtypes=["float64"], gradients=True)
    assert report.forward.passed and not report.passed
    assert all(
        dict(check.rows_alone_differing) == {"encoder.token_embedding.weight": (1,)} for check in report.gradients
    )
    assert report.verdict().endswith("at tokens.weight: only its row 1 differs (an embedding's padding_idx?).")


# --- the command line -----------------------------------------------------------------------------------


def cli(*args, cwd=ROOT):
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "bert_multi.cli", "verify", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=environment, timeout=300)


@runs_here("torch")
def test_the_command_says_pass_in_one_sentence_and_exits_0():
    done = cli("tests/subjects/torch_port.py:build", "--config", "tiny", "--gradients")
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last == (
        "PASS: torch_port.py:build computes the BERT of d2l 0.16 - 1.0: its outputs and activations, its gradients "
        "conform."
    )


@runs_here("torch")
def test_the_command_puts_each_gradient_difference_down_to_its_cause():
    done = cli("tests/subjects/torch_port.py:build_wrong_backward", "--config", "tiny", "--gradients", "--dtypes",
               "float64", "--cases", "full_valid_len")  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "FAIL: 0 follow the forward, 4 the backward's own, 25 carried" in done.stdout
    assert "  random projection (cpu): the backward of blks.0.ffn (yours: layers.0.up)," in done.stdout
    assert done.stdout.strip().endswith("at layers.0.up.weight: its module's own backward gives another gradient.")


def test_the_command_exits_1_and_writes_a_repro_that_needs_numpy_alone(tmp_path):
    done = cli("tests/subjects/torch_port.py:build_faulty", "--config", "tiny", "--dtypes", "float64",
               "--save-repro", str(tmp_path / "repro"), "--json", str(tmp_path / "report.json"))  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "first diverges at blks.0.attention (yours: layers.0.attn.out (output))" in done.stdout
    assert json.loads((tmp_path / "report.json").read_text())["passed"] is False
    # From anywhere, with NumPy alone: it says where, in plain numbers, and exits 1 as it shows a divergence.
    script = subprocess.run(
        [sys.executable, "-I", str(tmp_path / "repro" / "repro.py")], capture_output=True, text=True, cwd="/",
        timeout=60,
    )  # fmt: skip
    assert script.returncode == 1, script.stderr
    title, first, element = script.stdout.splitlines()
    assert title == "torch_port.py:build_faulty against the oracle: case mixed_valid_lens, float64 on cpu."
    assert first.startswith("first divergence: blks.0.attention (layers.0.attn.out (output)), max abs error ")
    number = r"-?[\d.e-]+"  # plain: 0.0723..., not np.float64(0.0723...)
    assert re.fullmatch(rf"first element outside the tolerance: \(\d+, \d+, \d+\), yours {number}, expected {number}",
                        element), element  # fmt: skip


@runs_here("torch")
def test_a_repro_quotes_the_model_files_name_never_runs_it(tmp_path):
    """A file named with a docstring's quotes and a backslash: the repro holds its name as a string, runs,
    and runs nothing the name says."""
    name = 'evil""";open("PWNED","w");"""\\x.py'
    (tmp_path / name).write_text((SUBJECTS / "torch_port.py").read_text())
    done = cli(f"{tmp_path / name}:build_faulty", "--config", "tiny", "--dtypes", "float64", "--cases",
               "full_valid_len", "--save-repro", str(tmp_path / "repro"))  # fmt: skip
    assert done.returncode == 1, done.stderr
    script = subprocess.run([sys.executable, "-I", str(tmp_path / "repro" / "repro.py")], capture_output=True,
                            text=True, cwd=tmp_path, timeout=60)  # fmt: skip
    assert script.returncode == 1, script.stderr
    assert script.stdout.splitlines()[0].startswith(f"{name}:build_faulty against the oracle")
    assert not (tmp_path / "PWNED").exists()


@runs_here("torch")
def test_an_exception_in_the_users_model_shows_their_frames_and_exits_2(tmp_path):
    (tmp_path / "broken.py").write_text(
        f"import sys\nsys.path.insert(0, {str(SUBJECTS)!r})\nimport torch_port\n\n"
        "class Broken(torch_port.MyBERT):\n    def forward(self, tokens, segments, valid_lens, positions):\n"
        "        return self.tokens(tokens.float())\n\n"
        "def build(config):\n    return Broken(50, 12, 20, 3, 2, 16)\n"
    )
    done = cli(f"{tmp_path / 'broken.py'}:build", "--config", "tiny")
    assert done.returncode == 2
    assert "Traceback (your code):" in done.stderr and "return self.tokens(tokens.float())" in done.stderr
    assert "bert_multi/verify" not in done.stderr and "site-packages" not in done.stderr


@runs_here("torch")
@pytest.mark.parametrize(
    "where, code",
    [
        ("import", "import sys\nsys.exit(0)\n"),
        ("factory", "import sys\n\ndef build(config):\n    sys.exit(0)\n"),
        (
            "forward",
            "import sys\nsys.path.insert(0, {subjects!r})\nimport torch_port\n\n"
            "class Leaves(torch_port.MyBERT):\n    def forward(self, *args):\n        raise SystemExit(1)\n\n"
            "def build(config):\n    return Leaves(50, 12, 20, 3, 2, 16)\n",
        ),
    ],
)
def test_a_users_code_that_exits_is_its_error_never_a_verdict(tmp_path, where, code):
    """``sys.exit(0)`` in the user's module, factory or model is their code's error (exit 2, their frames),
    never the "everything conforms" exit 0 with no verdict."""
    (tmp_path / "leaves.py").write_text(code.format(subjects=str(SUBJECTS)))
    done = cli(f"{tmp_path / 'leaves.py'}:build", "--config", "tiny")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "raised SystemExit" in done.stderr and "Traceback (your code):" in done.stderr


@runs_here("torch")
def test_a_factory_in_an_importable_module_is_found_by_its_dotted_name():
    environment = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    command = [sys.executable, "-m", "bert_multi.cli", "verify", "subjects.torch_port:build", "--config", "tiny"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=environment, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("conform."), done.stderr


@runs_here("torch")
def test_write_map_saves_the_placement_and_the_guess_as_map_files_that_work_as_written(tmp_path):
    written = tmp_path / "map.json"
    done = cli("tests/subjects/torch_matrices.py:build", "--config", "tiny", "--dtypes", "float64",
               "--write-map", str(written))  # fmt: skip
    assert done.returncode == 0 and f"the placement written to {written} (--map reads it)" in done.stdout
    rules = json.loads(written.read_text())["names"]
    assert rules["encoder.blks.{i}.attention.W_q.weight"] == "blocks.{i}.attention.wq.T"  # the oracle's decision
    again = cli("tests/subjects/torch_matrices.py:build", "--config", "tiny", "--dtypes", "float64", "--map",
                str(written))  # fmt: skip
    assert again.returncode == 0 and f"parameters placed by map file {written}" in again.stdout
    guessed = tmp_path / "guess.json"
    done = cli("tests/subjects/torch_port.py:build_three_types", "--config", "tiny", "--write-map", str(guessed))
    assert done.returncode == 2 and f"(written to {guessed}: check it, then pass --map {guessed})" in done.stderr
    assert json.loads(guessed.read_text())["names"]["encoder.segment_embedding.weight"] == "?"


@runs_here("torch")
def test_write_map_saves_a_placement_that_does_not_fit_for_the_user_to_finish(tmp_path):
    """A parameter no canonical tensor sets stops the run; the placement found is written all the same,
    and listing that parameter under "ignore" is all the map file then needs."""
    model = tmp_path / "extra.py"
    model.write_text(
        f"import sys\nimport torch\nsys.path.insert(0, {str(ROOT / 'tests')!r})\nfrom subjects import torch_port\n\n\n"
        "def build(config):\n"
        "    model = torch_port.build(config)\n    model.unused = torch.nn.Linear(3, 3)\n    return model\n"
    )
    written = tmp_path / "map.json"
    argv = [f"{model}:build", "--config", "tiny", "--dtypes", "float64", "--cases", "full_valid_len"]
    done = cli(*argv, "--write-map", str(written))
    assert done.returncode == 2 and "does not fit" in done.stderr and "['unused.weight', 'unused.bias']" in done.stderr
    contents = json.loads(written.read_text())
    assert contents["names"]["encoder.blks.{i}.attention.W_q.weight"] == "layers.{i}.attn.query.weight"
    written.write_text(json.dumps({**contents, "ignore": ["unused.weight", "unused.bias"]}))
    again = cli(*argv, "--map", str(written))
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("subject, backend", [("flax_notebook", "jax"), ("gluon_port", "mxnet")])
def test_a_model_of_a_framework_installed_elsewhere_is_verified_there_and_says_so(subject, backend, tmp_path):
    from bert_multi.backend.registry import load_backend

    if not not_in_process(backend):
        pytest.skip(f"{backend} runs in this process: nothing to send elsewhere")
    if load_backend(backend).elsewhere is None:
        pytest.skip(f"no environment with {backend} here")
    done = cli(f"tests/subjects/{subject}.py:build", "--config", "tiny", "--dtypes", "float64", "--json",
               str(tmp_path / "report.json"))  # fmt: skip
    first = done.stdout.splitlines()[0]
    package = {"jax": "jax", "mxnet": "mxnet"}[backend]
    assert first.startswith(f"your model imports {package}, which is not installed here: verify runs it in .venv")
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["forward"]["environment"]["python_executable"] != sys.executable  # written there
    assert done.returncode == (0 if report["passed"] else 1) and "Traceback" not in done.stderr


@runs_here("torch")
def test_set_up_errors_are_one_line_and_exit_2(tmp_path):
    assert "no file" in cli("nothere.py:build", "--config", "tiny").stderr
    done = cli("tests/subjects/torch_port.py:nothing", "--config", "tiny")
    assert done.returncode == 2 and "has no 'nothing'" in done.stderr and "Traceback" not in done.stderr
    done = cli("tests/subjects/torch_port.py:build_three_types", "--config", "tiny")
    assert (
        done.returncode == 2
        and "could not be placed" in done.stderr
        and '"ignore": [\n    "segments.weight"' in done.stderr
    )
    done = cli("tests/subjects/torch_port.py:build", "--config", "tiny", "--gradients", "--frozen", "position")
    assert done.returncode == 2 and "did you mean 'positions'" in done.stderr


# --- users' test suites ---------------------------------------------------------------------------------


@runs_here("torch")
def test_assert_model_conforms_raises_with_the_verdict():
    from subjects import torch_port

    assert assert_model_conforms(torch_port.build, "tiny").passed
    with pytest.raises(AssertionError, match="first diverges at blks.0.attention"):
        assert_model_conforms(torch_port.build_faulty, "tiny", dtypes=["float64"])


@runs_here("torch")
def test_the_pytest_plugin_gives_users_the_bert_verify_fixture(tmp_path):
    (tmp_path / "test_mine.py").write_text(
        f"import sys\nsys.path.insert(0, {str(SUBJECTS)!r})\nimport torch_port\n\n"
        "def test_good(bert_verify):\n    bert_verify(torch_port.build, 'tiny', dtypes=['float64'])\n\n"
        "def test_bad(bert_verify):\n    bert_verify(torch_port.build_faulty, 'tiny', dtypes=['float64'])\n"
    )
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "bert_multi.testing", "-p", "no:cacheprovider", "test_mine.py"],
        capture_output=True, text=True, cwd=tmp_path, env=environment, timeout=300,
    )  # fmt: skip
    assert "1 failed, 1 passed" in done.stdout, done.stdout[-3000:]
    assert "first diverges at blks.0.attention" in done.stdout
    assert "bert_multi/testing.py" not in done.stdout  # the failure is shown in the user's test, not in ours
    # A model whose weights cannot be placed: one failure message, and the map guessed for it written.
    (tmp_path / "test_mine.py").write_text(
        f"import sys\nsys.path.insert(0, {str(SUBJECTS)!r})\nimport torch_port\n\n"
        "def test_unplaced(bert_verify, tmp_path):\n    bert_verify(torch_port.build_three_types, 'tiny')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "bert_multi.testing", "-p", "no:cacheprovider", "test_mine.py",
         "--basetemp", str(tmp_path / "base")],
        capture_output=True, text=True, cwd=tmp_path, env=environment, timeout=300,
    )  # fmt: skip
    assert "1 failed" in done.stdout and "Traceback" not in done.stdout and "MappingError" not in done.stdout
    written = next((tmp_path / "base").rglob("bert_verify-map.json"))
    assert f"A map file guessed for it is in {written}" in done.stdout.replace("\n", "")
    assert json.loads(written.read_text())["names"]["encoder.segment_embedding.weight"] == "?"


def test_the_plugin_is_registered_for_pytest():
    import tomllib

    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert entry == {"bert_multi": "bert_multi.testing"}
