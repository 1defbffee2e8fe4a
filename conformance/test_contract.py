"""The backend contract (``bert_multi.backend.Backend``), held against every registered backend: the
project's own, the references, and any installed package's (a test below installs one, with an entry
point as pip would, and holds it to the same function).

What any backend must do, checked here once rather than per framework: build from canonical weights,
return ``BackendModel``s whose outputs, activations and exported weights have the contract's names,
shapes and dtypes and agree with the oracle; refuse bad input before its framework sees it; take the
standard options by the one rule; say "cannot run here" with ``CannotRunHere``; and offer what its
optional capabilities promise.
"""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from bert_multi import (
    BackendContractError,
    BackendModel,
    BERTConfig,
    BERTOutput,
    CannotRunHere,
    InputError,
    backend_names,
    backends,
    frameworks,
    intermediate_names,
    load_backend,
    param_shapes,
    random_weights,
)
from bert_multi.backend import ROLES, registry
from bert_multi.cli import main
from bert_multi.engine.cases import get_case
from bert_multi.engine.results import assert_conforms
from bert_multi.spec.schema import SUPPORTED_DTYPES
from bert_multi.spec.semantics import PRESETS
from bert_multi.training import LossValues, PretrainingData, builtin_corpus, paragraphs_from_lines

SIZES = dict(num_hiddens=12, ffn_num_hiddens=20, num_heads=3, num_blks=2, max_len=16)


def computable(backend, vocab_size=29):
    """A small config the backend computes: the first preset (d2l's first) that it supports."""
    for preset in PRESETS:
        config = BERTConfig(vocab_size, semantics=preset, **SIZES)
        if backend.supports(config) is None:
            return config
    pytest.fail(f"backend {backend.name!r} computes none of the presets {list(PRESETS)}")


def assert_meets_contract(name: str) -> None:
    """Everything the contract asks of the backend registered as ``name``, which loads here."""
    backend = load_backend(name)
    assert backend.name == backend.NAME == name and backend.role in ROLES and backend.label
    config = computable(backend)
    weights = random_weights(config, seed=21, dtype="float64")
    batch = get_case("mixed_valid_lens").batch(config, seed=2)
    B, T = batch["tokens"].shape
    P = batch["pred_positions"].shape[1]
    eps = backend.kernel_eps(config.semantics.layer_norm_eps)
    assert isinstance(eps, float) and abs(eps - config.semantics.layer_norm_eps) <= 1e-7 * eps
    expected = load_backend("numpy").build(config, weights, layer_norm_eps=eps)(**batch, intermediates=True)

    for dtype in SUPPORTED_DTYPES:
        model = backend.build(config, weights, dtype=dtype, gradients=False, share=True)
        assert isinstance(model, BackendModel)
        assert (model.backend, model.dtype, str(model.device)) == (name, dtype, "cpu")
        out = model(**batch, intermediates=True)
        assert isinstance(out, BERTOutput) and list(out.intermediates) == intermediate_names(config)
        assert out.encoded.shape == (B, T, config.num_hiddens)
        assert out.mlm.shape == (B, P, config.vocab_size) and out.nsp.shape == (B, 2)
        assert all(array.dtype == dtype for array in (out.encoded, out.mlm, out.nsp, *out.intermediates.values()))
        assert_conforms(out, expected, dtype)

        exported = model.export_weights()
        assert list(exported) == list(param_shapes(config))
        wrong = {n: exported[n].dtype.name for n in weights if exported[n].dtype != dtype}
        assert not wrong, f"{name} built in {dtype} exports {wrong}"
        assert all(np.array_equal(exported[n], weights[n].astype(dtype)) for n in weights)
        lent = model.export_weights(share=True)
        assert not any(array.flags.writeable for array in lent.values())
        again = backend.build(config, lent, dtype=dtype)(**batch)
        assert np.array_equal(again.encoded, model(**batch).encoded)

        info = model.runtime_info()
        assert (info["backend"], info["dtype"], info["device"]) == (name, dtype, "cpu")
        assert "framework" in info and "threads" in info

    plain = backend.build(config, weights)(batch["tokens"], batch["segments"], batch["valid_lens"])
    assert plain.intermediates is None and plain.mlm is None

    model = backend.build(config, weights)
    model._forward = lambda *args: pytest.fail(f"{name}'s framework saw invalid input")
    with pytest.raises(InputError, match="out of range"):
        model(np.full((1, 3), config.vocab_size), np.zeros((1, 3), int))

    with pytest.raises(ValueError, match="unknown build option 'tf33'"):
        backend.build(config, weights, tf33=True)
    assert "cpu" in backend.devices()
    with pytest.raises(CannotRunHere):
        backend.build(config, weights, device=f"cuda:{len(backend.devices()) + 7}")

    if backend.can_train:
        data = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(40)), max_len=SIZES["max_len"])
        trainable = computable(backend, vocab_size=len(data.vocab))
        trainer = backend.trainer(backend.build(trainable, random_weights(trainable, seed=3)))
        for method in ("loss", "gradients", "seed", "state", "load_state", "step"):
            assert callable(getattr(trainer, method)), method
        loss = trainer.step(next(data.batches(4, seed=0)))
        assert isinstance(loss, LossValues) and all(np.isfinite(loss))


@pytest.mark.parametrize("name", backend_names())
def test_every_registered_backend_meets_the_contract(name):
    status = backends()[name]
    if not status.available:
        pytest.skip(status.reason)
    assert_meets_contract(name)


def test_the_contract_check_catches_a_backend_that_breaks_it(monkeypatch):
    """The check above can fail: the oracle exporting one tensor under a wrong dtype breaks it."""
    oracle = load_backend("numpy")
    real = oracle.module.NumpyBERT.export_weights

    def wrong_dtype(self, share=False):
        exported = real(self, share)
        exported["nsp.output.bias"] = exported["nsp.output.bias"].astype(np.float16)
        return exported

    monkeypatch.setattr(oracle.module.NumpyBERT, "export_weights", wrong_dtype)
    with pytest.raises(AssertionError, match=r"numpy built in float32 exports \{'nsp.output.bias': 'float16'\}"):
        assert_meets_contract("numpy")


# --- A backend from another package, installed through an entry point ------------------------------

REPOSITORY = Path(__file__).resolve().parent.parent

# A package of someone else's: bert_multi's oracle under its own name and model class ("ext"), the same
# with its encoder output moved by 1e-3 ("extbad"), and two objects that break the contract.
EXTERNAL = '''
"""bert_multi backends from another package."""
from bert_multi import load_backend
from bert_multi.backend import BackendModel, BERTOutput

NAME = "ext"
LABEL = "External"


class ExtBERT(BackendModel):
    backend = NAME
    nudge = 0.0

    def __init__(self, inner):
        super().__init__(inner.config, inner.dtype, inner.device)
        self.inner = inner

    def _forward(self, inputs, intermediates):
        out = self.inner._forward(inputs, intermediates)
        return BERTOutput(out.encoded + self.nudge, out.mlm, out.nsp, out.intermediates)

    def export_weights(self, share=False):
        return self.inner.export_weights(share)

    def framework_info(self):
        return {"framework": "ext 0.1", "threads": 1}


def build(config, weights, device="cpu", dtype="float32", gradients=True, share=False):
    return ExtBERT(load_backend("numpy").build(config, weights, device, dtype, share=share))


class Faulty:
    NAME = "extbad"

    @staticmethod
    def build(config, weights, device="cpu", dtype="float32", gradients=True, share=False):
        model = build(config, weights, device, dtype, share=share)
        model.backend, model.nudge = "extbad", 1e-3
        return model


faulty = Faulty()
misnamed = Faulty()
shadow = Faulty()
'''


def install(site: Path) -> None:
    """Two distributions, as pip leaves them in site-packages: ext-bert with two good backends, and
    bad-plugins with three entries the registry must refuse or list as unavailable."""
    (site / "ext_bert.py").write_text(textwrap.dedent(EXTERNAL))
    for dist, entries in (
        ("ext_bert", "ext = ext_bert\nextbad = ext_bert:faulty\n"),
        ("bad_plugins", "misnamed = ext_bert:misnamed\nbroken = no_such_module\ntorch = ext_bert:shadow\n"),
    ):
        info = site / f"{dist}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[bert_multi.backends]\n{entries}")


@pytest.fixture
def installed(tmp_path, monkeypatch):
    install(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.refresh()
    yield tmp_path
    registry.refresh()


def test_an_installed_package_adds_its_backends_and_the_registry_refuses_what_breaks_the_rules(installed, capsys):
    status = backends()
    assert list(status)[:5] == ["numpy", "torch", "mxnet", "jax", "transformers"]  # the built-ins come first
    assert status["ext"].available and status["ext"].label == "External"
    assert status["ext"].where == "entry point ext = ext_bert (from ext-bert)"
    assert {"ext", "extbad", "misnamed", "broken"} <= set(frameworks())
    assert not status["misnamed"].available and "is refused: its NAME is 'extbad'" in status["misnamed"].reason
    assert not status["broken"].available and "No module named 'no_such_module'" in status["broken"].reason
    assert "pip install bad-plugins" in status["broken"].reason
    (refusal,) = registry.refused()
    assert refusal == (
        "entry point torch = ext_bert:shadow (from bad-plugins): refused, "
        "the name 'torch' is taken by bert_multi's own backend"
    )
    assert registry.registrations()["torch"].where == "bert_multi.torch"
    with pytest.raises(BackendContractError, match="its NAME is 'extbad'"):
        load_backend("misnamed")

    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "entry point ext = ext_bert (from ext-bert)" in out and f"refused: {refusal}" in out


def test_an_installed_backend_meets_the_contract_and_conform_runs_it(installed, capsys):
    assert_meets_contract("ext")
    argv = ["conform", "--config", "tiny", "--cases", "mixed_valid_lens,valid_lens_2d"]
    assert main([*argv, "--backends", "numpy,ext"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^ext float32 cpu +numpy +encoded ", out, flags=re.M)  # compared with the oracle's peer
    # a row per output (4) of each target against the oracle (2 backends x 2 dtypes) and each pair both ways (4)
    assert "PASS: 32 of 32 comparisons within tolerance, each the worst of 2 case(s)" in out
    assert main([*argv, "--backends", "numpy,extbad"]) == 1
    out = capsys.readouterr().out
    assert (
        "FAIL extbad vs oracle: first divergence at 'encoded' in 2 of 2 cases (mixed_valid_lens, valid_lens_2d)" in out
    )
    assert main([*argv, "--backends", "numpy,misnamed", "--dtypes", "float64"]) == 1  # broken is never a SKIP
    assert "ERROR: BackendContractError: backend 'misnamed'" in capsys.readouterr().out


def test_a_fresh_python_on_the_source_tree_finds_an_installed_backend(tmp_path):
    install(tmp_path)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPOSITORY}"}
    result = subprocess.run(
        [sys.executable, "-m", "bert_multi.cli", "backends"], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("ext "))
    assert row.split()[:4] == ["ext", "yes", "framework", "cpu"]
