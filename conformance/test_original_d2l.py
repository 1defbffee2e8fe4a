"""Every backend computes what the ORIGINAL d2l releases computed: 0.11.4, 0.14.4, 0.17.6 and 1.0.3
(MXNet), 0.17.6 and 1.0.3 (PyTorch), each run by ``conformance/original_d2l/generate.py`` from the
package registry with bert_multi's weights loaded by the release's own parameter names. The test suite
only reads the files; it installs nothing."""

import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from bert_multi import load_backend, load_weights
from bert_multi.backend import BERTOutput
from bert_multi.engine.results import OUTPUT_NAMES, assert_conforms, shifted

HERE = Path(__file__).parent / "original_d2l"
sys.path.insert(0, str(HERE))
from generate import RELEASES, fixture_name  # noqa: E402

RUNS = [(release, framework, preset) for release, framework, preset, _ in RELEASES]


def read(release, framework, preset):
    """The release's weights; per dtype it computed in, per case, (inputs, its outputs); the LayerNorm
    eps its framework used; and per dtype, the precision it really computed in (d2l 0.11's positional
    table stays float32 in a float64 model)."""
    config, weights = load_weights(HERE / f"weights-{preset}.npz")
    with np.load(HERE / f"{fixture_name(release, framework)}.npz", allow_pickle=False) as archive:
        stored = {key: archive[key] for key in archive.files}
    eps = float(stored.pop("layer_norm_eps"))
    precision = {key.split("/")[1]: str(stored.pop(key)) for key in list(stored) if key.startswith("precision/")}
    runs = {}
    for key in stored:
        case, kind, name = key.split("/")
        if kind != "inputs":
            inputs = {
                f: stored.get(f"{case}/inputs/{f}") for f in ("tokens", "segments", "valid_lens", "pred_positions")
            }
            outputs = BERTOutput(*(stored.get(f"{case}/{kind}/{n}") for n in OUTPUT_NAMES))
            runs.setdefault(kind, OrderedDict())[case] = (inputs, outputs)
    return config, weights, runs, eps, precision


@pytest.fixture(params=RUNS, ids=[f"d2l-{r}-{f}" for r, f, _ in RUNS])
def release(request):
    return request.param, read(*request.param)


def test_the_fixtures_cover_every_release_in_both_dtypes(release):
    (_, _, preset), (config, _, runs, _, _) = release
    assert config.semantics.name == preset
    assert sorted(runs) == ["float32", "float64"] and all(len(cases) == 6 for cases in runs.values())


def test_the_oracle_computes_what_each_release_computed(release):
    (_, _, _), (config, weights, runs, eps, precision) = release
    oracle = load_backend("numpy").build(config, weights, layer_norm_eps=eps)
    for dtype, cases in runs.items():
        for case, (inputs, original) in cases.items():
            try:
                assert_conforms(as_dtype(original, precision[dtype]), oracle(**inputs), precision[dtype])
            except AssertionError as error:
                raise AssertionError(f"{dtype} {case}: {error}") from None


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_each_backend_computes_what_each_release_computed(framework, release, dtype):
    """Backend against release: both carry their own rounding, so the pair tolerance (of the lower of the
    two precisions); the oracle's own difference between the frameworks' LayerNorm eps is added, as for
    any pair."""
    (_, _, _), (config, weights, runs, eps, precision) = release
    model = framework.build(config, weights, dtype=dtype)
    oracle = load_backend("numpy")
    at_backend, at_release = (
        oracle.build(config, weights, layer_norm_eps=e)
        for e in (framework.kernel_eps(config.semantics.layer_norm_eps), eps)
    )
    for case, (inputs, original) in runs[dtype].items():
        expected = shifted(original, at_backend(**inputs), at_release(**inputs))
        try:
            assert_conforms(as_dtype(model(**inputs), precision[dtype]), expected, precision[dtype], pair=True)
        except AssertionError as error:
            raise AssertionError(f"{case}: {error}") from None


def as_dtype(out, dtype):
    """Outputs labelled with the precision they are held to (the comparison itself runs in float64)."""
    return BERTOutput(*(None if a is None else a.astype(dtype) for a in (out.encoded, out.mlm, out.nsp)))
