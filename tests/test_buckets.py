"""Inputs padded to buckets (bert_multi.backend.buckets), held to the oracle: a padded call, cut back,
computes what the call asked for on every case of every generation; the cases of a run share a few shapes;
and what the rules leave unpadded would change what d2l computes if it were padded."""

import dataclasses

import numpy as np
import pytest

from bert_multi import BERTConfig, check_inputs, random_weights
from bert_multi.backend import oracle
from bert_multi.backend.buckets import bucket, distinct_padded, padded
from bert_multi.engine.cases import CASES
from bert_multi.spec.inputs import ModelInputs
from bert_multi.spec.schema import cut_max_len
from bert_multi.spec.semantics import PRESETS

CONFIG = BERTConfig(vocab_size=23, num_hiddens=12, ffn_num_hiddens=7, num_heads=3, num_blks=2, max_len=70)


def case_models(config):
    """(the oracle model each case runs on, the case's checked inputs), for every case."""
    weights = random_weights(config, seed=4, dtype="float64")
    for case in CASES:
        given = case.input(config, seed=3)
        cut, cut_weights = cut_max_len(config, weights, given.max_len or config.max_len)
        yield oracle.build(cut, cut_weights), check_inputs(cut, **given.batch)


def named_outputs(output):
    return {"encoded": output.encoded, "mlm": output.mlm, "nsp": output.nsp} | dict(output.intermediates or {})


def test_a_size_goes_to_the_least_power_of_two_of_at_least_four():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 64, 65)] == [4, 4, 4, 4, 8, 8, 16, 64, 128]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_padded_call_cut_back_computes_what_was_asked_on_every_case(preset):
    for model, inputs in case_models(CONFIG.with_semantics(preset)):
        bucketed = padded(inputs, model.config.semantics)
        asked = named_outputs(model(*inputs, intermediates=True))
        got = named_outputs(bucketed.cut(model(*bucketed.inputs, intermediates=True)))
        assert got.keys() == asked.keys() and len(asked) == 3 + 1 + 4 * CONFIG.num_blks + 1  # with the pooler
        for name, array in asked.items():
            if array is None:  # no MLM output without pred_positions; no pooler before d2l 0.12
                assert got[name] is None, name
                continue
            assert got[name].shape == array.shape, name
            np.testing.assert_allclose(got[name], array, rtol=1e-13, atol=1e-13, err_msg=name)


@pytest.mark.parametrize("preset, shapes", [("d2l", 5), ("d2l-0.11", 7)])
def test_the_cases_of_a_run_share_a_few_shapes(preset, shapes):
    # Counted by hand. Interleaved lengths: every batch pads to 4 rows and 4 predictions, so what stays
    # apart is the kind of valid_lens (one per sequence, one per query, none), pred_positions none, and the
    # max_len case's cut model. Tiled (d2l <= 0.15): no batch is padded, so batches of 1, 2, 3 and 4 stay
    # apart too; only the edge case's 4 predictions meet the 3 of the other batches of 2.
    config = CONFIG.with_semantics(preset)
    groups = {}  # max_len -> the batches run on the model of that max_len
    for case in CASES:
        given = case.input(config, seed=3)
        groups.setdefault(given.max_len or config.max_len, []).append(given.batch)
    found = [distinct_padded(dataclasses.replace(config, max_len=n), batches) for n, batches in groups.items()]
    assert sum(map(len, found)) == shapes, found


def test_padding_a_batch_of_a_tiled_generation_would_change_what_it_computes():
    # d2l <= 0.15 masks head j of sequence b with the length of sequence (b*h + j) mod B: the batch size
    # picks whose length it is, so padding the batch would mask real rows with the padding's lengths.
    model, inputs = next(case_models(CONFIG.with_semantics("d2l-0.11")))
    three = ModelInputs(*(a[:3] for a in inputs))  # valid_lens T, T/2 and 1
    assert padded(three, model.config.semantics).inputs.tokens.shape[0] == 3
    as_if_interleaved = padded(three, PRESETS["d2l"])
    assert as_if_interleaved.inputs.tokens.shape[0] == 4
    wrong = as_if_interleaved.cut(model(*as_if_interleaved.inputs)).encoded
    assert np.abs(wrong - model(*three).encoded).max() > 1e-2


def test_padding_the_steps_would_change_what_a_row_of_valid_length_zero_computes():
    # Every key of such a row is scored -1e6, so it attends to every position alike: to the padding too.
    model, inputs = next((m, i) for m, i in case_models(CONFIG) if i.valid_lens is not None and not i.valid_lens.any())
    B, T = inputs.tokens.shape
    longer = ModelInputs(np.pad(inputs.tokens, ((0, 0), (0, 4))), np.pad(inputs.segments, ((0, 0), (0, 4))),
                         inputs.valid_lens, inputs.pred_positions)  # fmt: skip
    assert padded(inputs, model.config.semantics).inputs.tokens.shape[1] == T
    assert np.abs(model(*longer).encoded[:, :T] - model(*inputs).encoded).max() > 1e-2
