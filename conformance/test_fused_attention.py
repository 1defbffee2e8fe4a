"""The fused attention (``attention="sdpa"``): each framework's own scaled-dot-product kernel computing
d2l's attention exactly, both layouts of lengths over heads, every case, both dtypes, held to the oracle by
the same policy; the suite catches the mistake a port makes with such a kernel (a plain mask, which a row
of valid_len 0 turns into NaN where d2l attends uniformly); and what it costs is what the docs say: no
attention weights."""

import math

import numpy as np
import pytest

from bert_multi import BERTConfig, CannotRunHere, random_weights
from bert_multi.engine.cases import CASES
from bert_multi.engine.conform import run_conformance
from bert_multi.engine.report import failure_details
from bert_multi.engine.results import Target

# Several heads, so that how lengths are laid out over them matters; an even width for d2l 0.11's table.
CONFIG = BERTConfig(vocab_size=29, num_hiddens=12, ffn_num_hiddens=10, num_heads=3, num_blks=2, max_len=14)


def fused(framework):
    if not framework.takes("attention"):
        pytest.skip(f"backend {framework.name!r} has no fused attention (its build takes no attention option)")
    return framework


# The generations whose attention differs: lengths interleaved over the heads (d2l 1.0), and tiled (d2l
# 0.12-0.15); the others change what comes before and after it.
@pytest.mark.parametrize("preset", ["d2l", "d2l-0.12"])
def test_the_fused_attention_computes_d2ls_on_every_case_in_both_dtypes(framework, preset):
    fused(framework)
    config = CONFIG.with_semantics(preset)
    # d2l 1.0's run pairs the two attentions of the framework too, weights moved both ways.
    attentions = ("d2l", "sdpa") if preset == "d2l" else ("sdpa",)
    targets = [Target(framework.name, dtype, attention=a) for a in attentions for dtype in ("float32", "float64")]
    cases = [case.input(config, seed=6) for case in CASES]
    report = run_conformance(config, random_weights(config, seed=6, dtype="float64"), targets, cases, pairs=True)
    assert report.passed, failure_details(report)
    assert not report.skipped and not report.errors
    against_oracle = {(str(check.target), check.case) for check in report.checks if check.against_oracle}
    assert against_oracle == {(str(target), case.name) for target in targets for case in cases}
    assert all(check.intermediates for check in report.checks)  # every activation compared
    assert all(info["attention"] == str(target).split()[1] for target, info in zip(targets, report.runtime.values())
               if "sdpa" in str(target))  # fmt: skip


def test_a_backend_without_a_fused_kernel_refuses_it_rather_than_computing_another_way(framework):
    if framework.takes("attention"):
        model = framework.build(CONFIG, random_weights(CONFIG), attention="sdpa")
        assert model.runtime_info()["attention"] == "sdpa"
        with pytest.raises(ValueError, match=r"unknown attention 'flash': expected one of \['d2l', 'sdpa'\]"):
            framework.build(CONFIG, random_weights(CONFIG), attention="flash")
        return
    with pytest.raises(CannotRunHere, match="has no 'attention' option, so cannot give attention='sdpa'"):
        framework.build(CONFIG, random_weights(CONFIG), attention="sdpa")


def test_the_price_is_d2ls_attention_weights(framework):
    """d2l's DotProductAttention keeps the weights it computed (the chapter plots them); a fused kernel
    never has them."""
    fused(framework)
    if framework.name != "torch":
        pytest.skip("only PyTorch's modules keep state between calls (Flax's are stateless)")
    batch = CASES[0].batch(CONFIG)
    weights = random_weights(CONFIG)
    for attention, kept in (("d2l", True), ("sdpa", False)):
        model = framework.build(CONFIG, weights, attention=attention)
        model(**batch)
        found = model.module.encoder.blks[0].attention.attention.attention_weights
        assert (found is not None) == kept
        if kept:
            assert found.shape == (len(batch["tokens"]) * CONFIG.num_heads, 12, 12)


def _plain_torch_mask(monkeypatch):
    """The fused attention with a plain mask: a row of valid_len 0 keeps no key."""
    import torch

    import bert_multi.torch.model as model

    def forward(self, queries, keys, values, valid_lens=None):
        mask = None
        if valid_lens is not None:
            per_query = valid_lens.shape[-1] if valid_lens.dim() == 2 else 1
            mask = torch.arange(keys.shape[2]) < valid_lens.reshape(queries.shape[0], -1, per_query, 1)
        return torch.nn.functional.scaled_dot_product_attention(queries, keys, values, attn_mask=mask)

    monkeypatch.setattr(model.FusedDotProductAttention, "forward", forward)


def _plain_jax_mask(monkeypatch):
    """The fused attention with an additive -inf mask: a row of valid_len 0 keeps no key."""
    import jax
    import jax.numpy as jnp
    from flax import linen as nn

    import bert_multi.jax.backend as backend
    import bert_multi.jax.model as model

    class PlainMask(model.FusedDotProductAttention):
        @nn.compact
        def __call__(self, queries, keys, values, valid_lens=None, training=False):
            bias = None
            if valid_lens is not None:
                per_query = valid_lens.shape[-1] if valid_lens.ndim == 2 else 1
                lens = valid_lens.reshape(queries.shape[0], -1, per_query, 1)
                bias = jnp.where(jnp.arange(keys.shape[1]) < lens, 0.0, -math.inf).astype(queries.dtype)
            return jax.nn.dot_product_attention(queries, keys, values, bias=bias)

    monkeypatch.setattr(model, "FusedDotProductAttention", PlainMask)
    traced = backend._apply  # a forward of its own: jit caches compiled code by the function it wraps
    monkeypatch.setattr(backend, "apply", backend.Jitted(lambda *arguments: traced(*arguments), static_argnums=(0, 1)))


def test_the_suite_catches_a_fused_attention_that_forgets_a_row_of_valid_len_0(framework, monkeypatch):
    fused(framework)
    plant = {"torch": _plain_torch_mask, "jax": _plain_jax_mask}.get(framework.name)
    if plant is None:
        pytest.skip(f"no planted fault for {framework.name!r}")
    plant(monkeypatch)
    cases = [case.input(CONFIG) for case in CASES]
    report = run_conformance(CONFIG, random_weights(CONFIG), [Target(framework.name, "float32", attention="sdpa")],
                             cases, pairs=False)  # fmt: skip
    failing = {check.case for check in report.failures()}
    assert failing == {"mixed_valid_lens", "valid_len_zero", "valid_lens_2d"}, failure_details(report)
    assert {check.first_divergence.name for check in report.failures()} == {"blks.0.attention"}
    assert all(not np.isfinite(check.first_divergence.max_abs) or check.first_divergence.max_abs > 1e-3
               for check in report.failures())  # fmt: skip
