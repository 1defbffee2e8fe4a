"""The golden fixtures: still what the code produces, and matched by every backend on every device here.

On a machine with one framework (a GPU box with PyTorch alone) these tests alone prove conformance.
"""

from pathlib import Path

import numpy as np
import pytest

from bert_multi import CannotRunHere, load_backend
from bert_multi.engine.cases import CASE_NAMES, KERNEL_PATHS
from bert_multi.engine.results import assert_conforms
from bert_multi.tools.fixtures import FIXTURE_CONFIGS, fixture_failures, read_fixtures, write_fixtures

FIXTURES = Path(__file__).parent / "fixtures"
REGENERATE = (
    "the code changed under the fixtures: if that was intended, run `bert-multi fixtures` from the repository root"
)


@pytest.fixture(scope="module")
def fixtures():
    return read_fixtures(FIXTURES)


def test_fixtures_are_small_and_complete(fixtures):
    # Tens of kilobytes per configuration: five of them (two d2l 1.0 sizes, two earlier generations, the
    # original BERT) stay well under 640 KB.
    assert sum(p.stat().st_size for p in FIXTURES.iterdir()) < 640_000
    assert [f.name for f in fixtures] == list(FIXTURE_CONFIGS)
    for fixture in fixtures:
        assert sorted(fixture.cases) == sorted(CASE_NAMES)


def test_fixtures_are_current(fixtures, tmp_path):
    write_fixtures(tmp_path)
    for stored, fresh in zip(fixtures, read_fixtures(tmp_path)):
        assert stored.config == fresh.config, REGENERATE
        assert all(np.array_equal(stored.weights[k], fresh.weights[k]) for k in stored.weights), REGENERATE
        for case, (batch, expected) in stored.cases.items():
            fresh_batch, fresh_expected = fresh.cases[case]
            for field, value in batch.items():
                assert (value is None and fresh_batch[field] is None) or np.array_equal(value, fresh_batch[field]), (
                    f"{stored.name}/{case}/{field}: {REGENERATE}"
                )
            # The oracle must still compute the stored numbers (to rounding: BLAS builds differ).
            assert_conforms(fresh_expected, expected, "float64")


def test_the_oracle_reproduces_the_fixtures(fixtures):
    for fixture in fixtures:
        oracle = load_backend("numpy").build(fixture.config, fixture.weights)
        for batch, expected in fixture.cases.values():
            out = oracle(**batch, intermediates=True)
            for name in ("encoded", "mlm", "nsp"):
                if getattr(expected, name) is not None:
                    np.testing.assert_allclose(getattr(out, name), getattr(expected, name), rtol=0, atol=1e-12)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_backend_matches_the_fixtures(framework, device, dtype, fixtures):
    # On a GPU, where a backend that compiles a program for each shape pays about a second for each, it
    # checks the case with every kind of length (T, T/2, 1 and 0); gpu-check's fixtures part the other
    # kernel paths (KERNEL_PATHS).
    cases = KERNEL_PATHS[:1] if device == "cuda" and framework.prepares else None
    try:
        failures = fixture_failures(framework, fixtures, device, dtype, cases=cases)
    except CannotRunHere as error:  # no such device here: say why
        pytest.skip(str(error))
    assert not failures, "\n".join(failures)
