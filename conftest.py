"""Fixtures shared by tests/ and conformance/: the framework backends (every one the registry knows) as a
parameter, each skipped with its reason where it cannot run in this process."""

import os

import pytest
from hypothesis import settings

from bert_multi import frameworks, load_backend
from bert_multi.backend.registry import not_in_process, share_the_process

# CI runs the same Hypothesis examples every time, so a red run can be reproduced; locally each run
# explores new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
# The tests run every framework in one process, on one GPU where there is one (pytest -m cuda).
share_the_process()

# Under pytest-xdist (`make test`: --dist loadfile) each process takes a whole file at a time, in the
# order collected, so a long file collected last keeps one process busy while the others idle: the
# files that took 15 s or more in either environment (CI, 2026-11-26) go first, the longest first.
LONGEST_FIRST = [
    "conformance/test_suite.py",
    "tests/test_verify.py",
    "conformance/test_faults.py",
    "conformance/test_properties.py",
    "tests/test_jax_backend.py",
    "tests/test_distributed.py",
    "tests/test_hostile_files.py",
    "tests/test_kernels.py",
    "tests/test_huggingface.py",
    "conformance/test_fixtures.py",
    "tests/test_resume.py",
    "tests/test_backends.py",
    "tests/test_pretraining.py",
    "conformance/test_original_d2l.py",
    "tests/test_torch_backend.py",
    "tests/test_hostile_worker.py",
    "tests/test_cli.py",
    "tests/test_environments.py",
    "tests/test_lessons.py",
    "tests/test_gpu_check.py",
]


# `make test` runs the suite in both environments, and PyTorch is in both. BERT_MULTI_TESTED_ELSEWHERE
# ("torch=.venv,once=.venv") tells the second run what the first ran: a framework's own tests (there it
# skips the tests whose parameters name that framework alone, its backend's file, and the tests of users'
# models of it (``runs_here``, which marks them ``subject``), and keeps the rest:
# the core's, and the conformance suite's, under NumPy 2; those that pair the framework with another), and
# the tests marked `once`, whose subject is the same in every environment.
TESTED_ELSEWHERE = "BERT_MULTI_TESTED_ELSEWHERE"
ONCE = "once"
SUBJECT = "subject"


def tested_elsewhere() -> dict[str, str]:
    """Framework (or ``once``) -> the environment that runs its tests, from ``TESTED_ELSEWHERE``; unknown
    names are an error, not a quiet run of everything."""
    setting = os.environ.get(TESTED_ELSEWHERE, "")
    elsewhere = dict(entry.partition("=")[::2] for entry in setting.split(",") if entry)
    known = [*frameworks(), ONCE]
    unknown = [name for name, where in elsewhere.items() if name not in known or not where]
    if unknown:
        raise pytest.UsageError(f"{TESTED_ELSEWHERE}={setting!r}: expected NAME=ENVIRONMENT,... of {known}")
    return elsewhere


def run_elsewhere(named: set[str], elsewhere: dict[str, str]) -> str | None:
    """Why a test of the frameworks (or ``once``) ``named`` is skipped here, or None: another environment of
    the run runs every one of them (``tested_elsewhere``)."""
    if not named or not named <= elsewhere.keys():
        return None
    return f"{', '.join(sorted(named))}: run in {', '.join(sorted({elsewhere[name] for name in named}))} (make test)"


def subjects_named(item, names: set[str]) -> set[str]:
    """Of ``names``, those a test names: in its parameters' values, its file's (``test_torch_backend.py``) or
    its ``subject`` mark (``runs_here``); and ``once`` where it is so marked."""
    values = item.callspec.params.values() if hasattr(item, "callspec") else ()
    named = {value for value in values if isinstance(value, str) and value in names}
    marked = {mark.args[0] for mark in item.iter_markers(SUBJECT)} & names
    stem = os.path.basename(item.nodeid.split("::")[0])
    once = {ONCE} if item.get_closest_marker(ONCE) else set()
    return named | marked | once | {name for name in names if stem == f"test_{name}_backend.py"}


def pytest_collection_modifyitems(config, items):
    """The files of ``LONGEST_FIRST`` first, in its order; each file's tests stay together, in their order.
    Under ``-m cuda`` the cheapest first instead (``cuda_cost``). A test of frameworks whose tests another
    environment of the run runs, or marked ``once`` where it runs those, is skipped (``TESTED_ELSEWHERE``)."""
    elsewhere, names = tested_elsewhere(), set(frameworks())
    for item in items:
        reason = run_elsewhere(subjects_named(item, names), elsewhere)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
    missing = [path for path in LONGEST_FIRST if not os.path.isfile(os.path.join(os.path.dirname(__file__), path))]
    if missing:
        raise pytest.UsageError(f"conftest.py's LONGEST_FIRST names files that are not here: {missing}")
    rank = {path: position for position, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    if "cuda" in (config.getoption("markexpr") or ""):
        items.sort(key=cuda_cost)


class Marks(list):
    """Marks that decorate a test together, or go to ``pytest.param(..., marks=...)`` as they are."""

    def __call__(self, test):
        for mark in self:
            test = mark(test)
        return test


def runs_here(backend: str) -> Marks:
    """Marks that skip a test unless the backend's framework runs in this process (users' models of it are
    built and wrapped here), with the reason it does not, and make it a test of that framework alone
    (``subject``): ``make test`` runs it where that framework's own tests run."""
    reason = not_in_process(backend)
    return Marks([pytest.mark.skipif(reason is not None, reason=str(reason)), pytest.mark.subject(backend)])


def pretraining_outputs(model, inputs: dict) -> dict:
    """A transformers ``BertForPreTraining``'s outputs on d2l's ``inputs`` (``valid_lens`` as the attention
    mask it means), by transformers' own call: the encoding, the MLM logits at ``pred_positions``, the NSP
    logits, as NumPy arrays."""
    import numpy as np
    import torch

    tokens = torch.from_numpy(inputs["tokens"])
    mask = torch.arange(tokens.shape[1])[None, :] < torch.from_numpy(inputs["valid_lens"])[:, None]
    with torch.no_grad():
        out = model(tokens, attention_mask=mask.long(), token_type_ids=torch.from_numpy(inputs["segments"]),
                    output_hidden_states=True)  # fmt: skip
    rows = np.arange(tokens.shape[0])[:, None]
    return {
        "encoded": out.hidden_states[-1].numpy(),
        "mlm": out.prediction_logits.numpy()[rows, inputs["pred_positions"]],
        "nsp": out.seq_relationship_logits.numpy(),
    }


def encoder_outputs(config, weights: dict, inputs: dict) -> dict:
    """The oracle's encoding of ``inputs`` in float64 on ``weights``, and the pooled output (Dense + tanh on
    <cls>) worked by hand: what an encoder-only checkpoint's own software computed, to compare with."""
    import numpy as np

    from bert_multi.backend.registry import load_backend

    weights = {name: array.astype(np.float64) for name, array in weights.items()}
    encoded = load_backend("numpy").build(config, weights, dtype="float64")(**inputs).encoded
    return {
        "encoded": encoded,
        "pooled": np.tanh(encoded[:, 0] @ weights["hidden.0.weight"].T + weights["hidden.0.bias"]),
    }


def saved_mismatches(saved: dict, computed: dict, whose: str, dtype: str) -> list[str]:
    """What of ``computed`` differs, beyond ``dtype``'s tolerance on the CPU, from the outputs a fixture saved
    under ``whose/`` (``saved``: the fixture's arrays by name); a fixture with none saved there fails."""
    from bert_multi.engine.compare import compare_arrays, tolerance_for

    prefix = f"{whose}/"
    theirs = {name.removeprefix(prefix): array for name, array in saved.items() if name.startswith(prefix)}
    assert theirs, f"no outputs of {whose} saved to compare with"
    comparisons = [
        compare_arrays(name, computed[name], array, tolerance_for(dtype, "cpu")) for name, array in theirs.items()
    ]
    return [comparison.describe() for comparison in comparisons if not comparison.passed]


def cuda_cost(item):
    """Under ``pytest -m cuda`` (on a GPU machine lent for minutes, the tests one after another) the
    cheapest first, so that a run stopped at its limit has done the most: what compiles nothing (PyTorch,
    about a second a test) before what compiles a program for each shape (JAX, about a second a program),
    and of those the fixtures, the most programs, last."""
    compiles = "jax" in item.nodeid
    return compiles, compiles and item.nodeid.startswith("conformance/test_fixtures.py")


@pytest.fixture(params=frameworks())
def framework(request):
    """Each framework backend in turn, in the environment where it runs in this process (one run by
    another environment's worker is tested there, and the worker by tests/test_environments.py); those
    marked ``needs("Pretrainer", ...)`` only for a backend offering those capabilities of the contract."""
    reason = not_in_process(request.param)
    if reason:
        pytest.skip(reason)
    backend = load_backend(request.param)
    for marker in request.node.iter_markers("needs"):
        lacking = [capability for capability in marker.args if getattr(backend.module, capability, None) is None]
        if lacking:
            pytest.skip(f"backend {backend.name!r} has no {', '.join(lacking)} (capabilities of the backend contract)")
    return backend
