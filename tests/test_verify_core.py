"""``verify``'s framework-free parts: the parameter mapping and map files, a NumPy-protocol model held to
the oracle, and ``verify_masking``'s statistics."""

import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from subjects import masking

from bert_multi import (
    CONFIGS,
    MappingError,
    UsageError,
    UserCodeError,
    WeightsError,
    param_shapes,
    random_weights,
    verify,
    verify_masking,
)
from bert_multi.backend import backward, oracle
from bert_multi.verify.map_file import parse_placement, read_map, write_map
from bert_multi.verify.mapping import Placement, map_parameters

CONFIG = CONFIGS["tiny"]
SHAPES = param_shapes(CONFIG)


def test_known_names_are_found_under_a_wrapper_prefix():
    mapping = map_parameters(CONFIG, [(f"module.{name}", shape) for name, shape in SHAPES.items()])
    assert mapping.how == "names (d2l >= 0.12's PyTorch names, under the prefix 'module.')"
    assert all(p.name == f"module.{c}" for c, p in mapping.placements.items())


def test_gluon_names_are_known_and_say_so():
    from bert_multi.backend.contract import framework_names
    from bert_multi.files.formats.gluon import NAME_RULES

    gluon = framework_names(CONFIG, NAME_RULES)
    mapping = map_parameters(CONFIG, [(gluon[name], shape) for name, shape in SHAPES.items()])
    assert mapping.how.startswith("names (d2l >= 0.12's Gluon names")
    assert mapping.placements["mlm.mlp.2.weight"].name == "mlm.mlp.1.gamma"


def test_own_names_in_the_schemas_order_are_placed_by_order_and_the_report_says_it_was_inferred():
    parameters = [(f"p{i}", shape) for i, shape in enumerate(SHAPES.values())]
    mapping = map_parameters(CONFIG, parameters)
    assert mapping.how == "registration order and shape (45 tensors, inferred: check them)"
    assert [p.name for p in mapping.placements.values()] == [name for name, _ in parameters]


def test_a_fused_qkv_under_its_own_names_is_placed_by_order_and_shape():
    parameters = []
    for name, shape in SHAPES.items():
        if ".W_k." in name or ".W_v." in name:
            continue
        if ".W_q." in name:
            name, shape = name.replace("W_q", "qkv"), (3 * shape[0], *shape[1:])
        parameters.append((f"net.{name}".replace("encoder.blks", "layers"), shape))
    mapping = map_parameters(CONFIG, parameters)
    assert mapping.how == (
        "names (d2l >= 0.12's PyTorch names, under the prefix 'net.': 13 tensors) + registration order and shape "
        "(32 tensors, inferred: check them)"
    )
    fused = Placement("net.layers.1.attention.qkv.bias", part=(2, 3))
    assert mapping.placements["encoder.blks.1.attention.W_v.bias"] == fused


def test_a_mapping_that_cannot_be_found_lists_what_is_missing_and_a_map_file_that_places_it(tmp_path):
    # A segment table of three rows where d2l's has two: nothing has its shape, and names place nothing.
    parameters = [(f"net.{n}".replace("encoder.", "enc."), (3, 12) if "segment" in n else s) for n, s in SHAPES.items()]
    parameters = [(name.replace("enc.segment_embedding.weight", "enc.types"), shape) for name, shape in parameters]
    with pytest.raises(MappingError) as caught:
        map_parameters(CONFIG, parameters)
    message = str(caught.value)
    assert "1 canonical tensor(s) could not be placed" in message
    assert "Not placed: encoder.segment_embedding.weight (2, 12)." in message
    template = caught.value.suggested
    assert json.loads(message[message.index("\n{") :]) == template
    assert template["names"]["encoder.segment_embedding.weight"] == "?" and template["ignore"] == ["net.enc.types"]
    assert template["names"]["encoder.blks.{i}.attention.W_k.weight"] == "net.enc.blks.{i}.attention.W_k.weight"
    template["names"]["encoder.segment_embedding.weight"] = "net.enc.types[0/1]"  # a user's fix: not this one
    template["ignore"] = []
    path = tmp_path / "map.json"
    path.write_text(json.dumps(template))
    with pytest.raises(MappingError, match=r"encoder.segment_embedding.weight \(2, 12\) -> net.enc.types"):
        map_parameters(CONFIG, parameters, read_map(path))


def test_parts_and_transposes_go_there_and_back_exactly():
    parameters = [("qkv", (36, 12)), ("w_o_t", (12, 12))]
    rules = {f"encoder.blks.0.attention.W_{x}.weight": f"qkv[{k}/3]" for k, x in enumerate("qkv")}
    rules["encoder.blks.0.attention.W_o.weight"] = "w_o_t.T"
    from bert_multi.verify.map_file import MapFile
    from bert_multi.verify.mapping import ParameterMap

    placements = MapFile(rules, (), "test").expand(SHAPES)
    mapping = ParameterMap(placements, dict(parameters), "test")
    weights = {name: np.random.default_rng(0).standard_normal(SHAPES[name]) for name in rules}
    user = mapping.to_user(weights)
    assert np.array_equal(user["qkv"][12:24], weights["encoder.blks.0.attention.W_k.weight"])
    assert np.array_equal(user["w_o_t"], weights["encoder.blks.0.attention.W_o.weight"].T)
    back = mapping.to_canonical(user, SHAPES)
    assert all(np.array_equal(back[name], weights[name]) for name in rules)


def test_a_parameter_no_canonical_tensor_sets_is_an_error_unless_ignored(tmp_path):
    parameters = [*((f"m.{n}", s) for n, s in SHAPES.items()), ("m.classifier.weight", (3, 12))]
    with pytest.raises(MappingError, match="classifier.weight"):
        map_parameters(CONFIG, parameters)
    (tmp_path / "map.json").write_text(json.dumps({"ignore": ["m.classifier.weight"]}))
    assert len(map_parameters(CONFIG, parameters, read_map(tmp_path / "map.json")).placements) == len(SHAPES)


@pytest.mark.parametrize(
    "text, problem",
    [
        (b"\xff\xfe", "not a JSON map file"),
        (b"[1, 2]", "expected an object"),
        (b'{"names": {"a": 1}}', "must map canonical names to strings"),
        (b'{"names": {"a": "b[3/3]"}}', "does not exist"),
        (b'{"renames": {}}', "expected an object"),
        (b'{"pooler_output": ""}', "must be a module's path"),
        (b"[" * 100_000, "not a JSON map file"),
    ],
)
def test_a_malformed_map_file_is_a_weights_error_naming_the_file(tmp_path, text, problem):
    path = tmp_path / "bad.json"
    path.write_bytes(text)
    with pytest.raises(WeightsError, match=problem) as caught:
        read_map(path)
    assert str(path) in str(caught.value)


def test_what_a_map_file_declares_beside_its_placements_is_kept_by_the_map_written_from_it(tmp_path):
    given = {"names": {}, "absent": ["nsp.output.{p}"], "pooler_output": "pool"}
    (tmp_path / "map.json").write_text(json.dumps(given))
    declared = read_map(tmp_path / "map.json").declared()
    assert declared == {"absent": ["nsp.output.{p}"], "pooler_output": "pool"}
    write_map(tmp_path / "again.json", {"names": {}, "ignore": [], **declared})
    again = read_map(tmp_path / "again.json")
    assert again.declared() == declared
    (tmp_path / "bare.json").write_text("{}")
    assert read_map(tmp_path / "bare.json").declared() == {}


def test_a_map_rule_that_names_no_canonical_tensor_is_refused(tmp_path):
    (tmp_path / "map.json").write_text(json.dumps({"names": {"encoder.blocks.{i}.W_q.weight": "x"}}))
    with pytest.raises(UsageError, match="names no canonical tensor"):
        map_parameters(CONFIG, list(SHAPES.items()), read_map(tmp_path / "map.json"))


def test_placements_parse():
    assert parse_placement("a.b.T") == Placement("a.b", True)
    assert parse_placement("a.b[1/3]") == Placement("a.b", False, (1, 3))
    assert parse_placement("a.b[1/3].T") == Placement("a.b", True, (1, 3))
    assert parse_placement("seg.weight[1:]") == Placement("seg.weight", rows=1)
    assert parse_placement(" a module.weight.T ") == Placement("a module.weight", True)  # a name with a space
    with pytest.raises(UsageError, match="is not a parameter name"):
        parse_placement("two\nlines")  # a name that would print over two lines
    assert parse_placement("seg.weight[1:]").describe() == "seg.weight[1:]"


def test_a_table_placed_after_its_padding_row_moves_both_ways_with_that_row_zero(tmp_path):
    """A segment table of 3 rows, row 0 for padding: the canonical rows go in after it, and come back
    (parameters or gradients) without it; a table of the wrong size does not fit."""
    parameters = list(SHAPES.items())
    index = next(i for i, (name, _) in enumerate(parameters) if name == "encoder.segment_embedding.weight")
    parameters[index] = ("segments", (3, CONFIG.num_hiddens))
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"names": {"encoder.segment_embedding.weight": "segments[1:]"}}))
    mapping = map_parameters(CONFIG, parameters, read_map(path))
    weights = random_weights(CONFIG, seed=1, dtype="float64")
    user = mapping.to_user(weights)["segments"]
    assert user.shape == (3, CONFIG.num_hiddens) and not user[0].any()
    np.testing.assert_array_equal(user[1:], weights["encoder.segment_embedding.weight"])
    back = mapping.to_canonical({"segments": user}, SHAPES)["encoder.segment_embedding.weight"]
    np.testing.assert_array_equal(back, weights["encoder.segment_embedding.weight"])
    path.write_text(json.dumps({"names": {"encoder.segment_embedding.weight": "segments[2:]"}}))
    with pytest.raises(MappingError, match=r"segments\[2:\]: that parameter's shape is \(3, 12\)"):
        map_parameters(CONFIG, parameters, read_map(path))


# --- a NumPy-protocol model ------------------------------------------------------------------------------


class OracleInDisguise:
    """Any model behind the NumPy protocol: here the oracle itself, optionally with a planted fault."""

    def __init__(self, config, fault=None, activations=True, gradients=True):
        self.config, self.fault, self.activations = config, fault, activations
        if gradients:
            self.gradients = self._gradients

    def load_weights(self, weights):
        self.weights = dict(weights)

    def __call__(self, tokens, segments, valid_lens, pred_positions):
        if self.fault == "ignores valid_lens":
            valid_lens = None
        record = OrderedDict()
        out = oracle.forward(self.config, self.weights, (tokens, segments, valid_lens, pred_positions), record)
        returned = (out.encoded, out.mlm, out.nsp)
        return returned + ((dict(record),) if self.activations else ())

    def _gradients(self, tokens, segments, valid_lens, pred_positions, d_encoded, d_mlm, d_nsp):
        inputs = (tokens, segments, valid_lens, pred_positions)
        grads = backward.gradients(self.config, self.weights, inputs, d_encoded, d_mlm, d_nsp)
        if self.fault == "frozen positions":
            grads["encoder.pos_embedding"] = None
        return grads


def test_a_numpy_protocol_model_is_held_to_the_oracle_forward_and_gradients():
    report = verify(OracleInDisguise(CONFIG), CONFIG, gradients=True)
    assert report.passed, report.failures()
    assert report.forward.checks and all(check.intermediates for check in report.forward.checks)
    assert [check.scalar for check in report.gradients] == ["random projection", "pretraining loss"]


def test_a_numpy_protocol_model_without_activations_is_still_held_to_its_outputs():
    report = verify(OracleInDisguise(CONFIG, activations=False), CONFIG)
    assert report.passed and all(not check.intermediates and check.outputs for check in report.forward.checks)
    report = verify(OracleInDisguise(CONFIG, "ignores valid_lens", activations=False), CONFIG)
    assert not report.passed and "first diverges at encoded" in report.verdict()


@pytest.mark.parametrize(
    "kind, made", [("complex128", lambda a: a + 0j), ("<U32", lambda a: a.astype(str)), ("int64", np.int64)]
)
def test_outputs_that_are_not_real_numbers_are_the_models_error_never_compared(kind, made):
    """A complex encoding (its imaginary part would be dropped) or numbers as strings (they would be parsed):
    the model's error, naming what it returned, before anything is compared."""

    class Odd(OracleInDisguise):
        def __call__(self, *inputs):
            encoded, *rest = super().__call__(*inputs)
            return (made(encoded), *rest)

    with pytest.raises(
        UserCodeError, match=rf"its encoded is an array of {kind}; expected real floating point"
    ) as caught:
        verify(Odd(CONFIG), CONFIG, dtypes=["float64"], cases=["full_valid_len"])
    assert "Traceback" not in str(caught.value)  # nothing of theirs raised: what they returned is the error


@pytest.mark.parametrize("where", ["encoded", "activation"])
def test_an_output_of_billions_of_values_is_the_models_error_never_compared(where):
    """A broadcast view costs nothing to return and tens of GB to compare: refused by its size at once."""

    class Huge(OracleInDisguise):
        def __call__(self, *inputs):
            encoded, mlm, nsp, record = super().__call__(*inputs)
            huge = np.broadcast_to(np.float64(0.5), (*encoded.shape[:2], 10**9))
            if where == "encoded":
                return huge, mlm, nsp, record
            return encoded, mlm, nsp, {**record, "blks.0.ffn": huge}

    with pytest.raises(
        UserCodeError, match=r"has shape \(\d+, \d+, 1000000000\), \d+ values, more than 4 times"
    ) as caught:
        verify(Huge(CONFIG), CONFIG, dtypes=["float64"], cases=["full_valid_len"])
    assert ("its encoded" if where == "encoded" else "its blks.0.ffn") in str(caught.value)


@pytest.mark.parametrize("returned", [None, (x for x in ()), np.zeros(3)])
def test_what_a_model_returns_in_place_of_its_outputs_is_its_error_shown_without_bert_multis_frames(returned):
    class Returns(OracleInDisguise):
        def __call__(self, *inputs):
            return returned

    with pytest.raises(UserCodeError, match="the model returned") as caught:
        verify(Returns(CONFIG), CONFIG, dtypes=["float64"], cases=["full_valid_len"])
    assert "bert_multi" not in str(caught.value)


def test_a_fault_is_named_at_the_first_activation_it_moves():
    report = verify(OracleInDisguise(CONFIG, "ignores valid_lens"), CONFIG, dtypes=["float64"])
    assert not report.passed
    assert report.verdict().startswith("FAIL: OracleInDisguise first diverges at blks.0.attention")


def test_the_verdict_names_the_first_divergence_in_computation_order_whatever_case_shows_it():
    """One case diverges only at the NSP output, a later one at the first attention already: the verdict
    names the attention, the earlier in the computation."""

    class Two(OracleInDisguise):
        def __call__(self, tokens, segments, valid_lens, pred_positions):
            if valid_lens is None:
                encoded, mlm, nsp, record = super().__call__(tokens, segments, valid_lens, pred_positions)
                return encoded, mlm, nsp + 1.0, record
            return super().__call__(tokens, segments, None, pred_positions)  # valid_lens ignored

    report = verify(Two(CONFIG), CONFIG, dtypes=["float64"], cases=["no_valid_lens", "mixed_valid_lens"])
    firsts = {check.case: check.first_divergence.name for check in report.forward.failures()}
    assert firsts == {"no_valid_lens": "nsp", "mixed_valid_lens": "blks.0.attention"}
    assert report.verdict().startswith("FAIL: Two first diverges at blks.0.attention (yours: ")


def test_a_pass_says_which_dtypes_and_devices_did_not_run():
    report = verify(OracleInDisguise(CONFIG), CONFIG, dtypes=["float64"], devices=["cpu", "cuda"])
    assert report.passed
    assert "(not run here: float64 on cuda" in report.verdict()


def test_the_checks_after_the_run_are_given_the_float64_set_up_not_the_runs_last_build():
    """One model object, run in float64 then float32: its gradients are checked with the float64 weights
    again (with the float32 ones it holds after the run, they would differ by float32's rounding)."""
    model = OracleInDisguise(CONFIG)
    report = verify(model, CONFIG, dtypes=["float64", "float32"], gradients=True)
    assert [check.target.dtype for check in report.forward.checks][-1] == "float32"
    assert report.passed, report.failures()
    assert all(array.dtype == np.float64 for array in model.weights.values())


def test_no_gradient_where_the_oracle_has_one_fails_unless_stated_frozen():
    model = OracleInDisguise(CONFIG, "frozen positions")
    report = verify(model, CONFIG, dtypes=["float64"], gradients=True)
    assert not report.passed and report.gradients[0].ungraded == ("encoder.pos_embedding",)
    assert "no gradient reaches encoder.pos_embedding" in report.failures()
    assert verify(model, CONFIG, dtypes=["float64"], gradients=True, frozen=["encoder.pos_embedding"]).passed


def test_a_gradient_check_that_compared_nothing_fails():
    everything = list(SHAPES)
    report = verify(OracleInDisguise(CONFIG), CONFIG, dtypes=["float64"], gradients=True, frozen=everything)
    assert report.forward.passed and not report.passed


def test_frozen_names_are_checked_before_anything_runs():
    with pytest.raises(UsageError, match="did you mean 'encoder.pos_embedding'"):
        verify(OracleInDisguise(CONFIG), CONFIG, gradients=True, frozen=["encoder.pos_embeding"])


def test_what_verify_cannot_take_is_refused_in_one_sentence():
    with pytest.raises(UsageError, match="verify takes a PyTorch nn.Module, a Gluon Block"):
        verify(lambda config: object(), CONFIG)


def test_an_exception_in_the_users_factory_is_theirs_with_their_frames():
    def broken_factory(config):
        return config.no_such_field

    with pytest.raises(UserCodeError) as caught:
        verify(broken_factory, CONFIG)
    message = str(caught.value)
    assert "AttributeError" in message and "broken_factory" in message and "return config.no_such_field" in message
    assert "bert_multi/verify" not in message  # only the user's frames


# --- verify_masking -------------------------------------------------------------------------------------


def test_d2ls_masking_follows_berts_rule():
    report = verify_masking(masking.get_mlm_data_from_tokens)
    assert report.passed, report.describe()
    assert report.predictions > 10_000


def test_the_randint_bug_is_caught_and_explained():
    report = verify_masking(masking.with_randint)
    assert not report.passed
    failing = [check for check in report.checks if not check.passed]
    assert [check.name for check in failing] == ["random tokens uniform over the vocabulary"]
    assert "are <unk>" in failing[0].detail and "random.randint" in failing[0].detail


def test_masking_that_never_keeps_or_replaces_fails_the_proportions():
    report = verify_masking(masking.always_mask)
    assert {check.name for check in report.checks if not check.passed} >= {"replaced by <mask>", "kept"}


def test_masking_that_predicts_cls_breaks_a_rule():
    def predicts_cls(tokens, vocab):
        ids, positions, labels = masking.get_mlm_data_from_tokens(tokens, vocab)
        return ids, [0, *positions[1:]], [vocab["<cls>"], *labels[1:]]

    report = verify_masking(predicts_cls)
    assert not report.checks[0].passed and "<cls>/<sep>" in report.checks[0].detail


def test_verify_masking_leaves_pythons_random_as_it_was():
    import random

    random.seed(123)
    expected = random.random()
    random.seed(123)
    verify_masking(masking.get_mlm_data_from_tokens, calls=10)
    assert random.random() == expected


def test_the_weights_are_random_from_the_seed_and_checked():
    with pytest.raises(WeightsError):
        verify(OracleInDisguise(CONFIG), CONFIG, weights={"x": np.zeros(1)})
    assert verify(OracleInDisguise(CONFIG), CONFIG, weights=random_weights(CONFIG, seed=3), dtypes=["float64"]).passed


def test_a_masking_function_that_exits_is_its_error():
    def leaves(tokens, vocab):
        raise SystemExit(0)

    with pytest.raises(UserCodeError, match="your masking function raised SystemExit: 0"):
        verify_masking(leaves)


def test_a_name_a_file_lacks_is_refused_listing_what_it_defines_private_helpers_included():
    from bert_multi.verify.session import load_factory

    with pytest.raises(UsageError, match=r"has no 'nope'; it defines \['_get_batch_loss_bert', 'train_bert'\]"):
        load_factory(str(Path(__file__).parent / "subjects" / "d2l_loss.py") + ":nope")
