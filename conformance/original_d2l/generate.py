"""Golden fixtures computed by the ORIGINAL d2l releases: every generation, both frameworks.

    .venv/bin/python conformance/original_d2l/generate.py      (from the repository root)

For each (release, framework) below it installs ``d2l==release`` with ``--no-deps`` into a throw-away
directory and runs a child process in which that d2l is importable (packages it imports but BERT never
uses, such as pandas or torchvision, are stubbed). There the release's own ``BERTModel`` is built on a
small config, bert_multi's canonical weights are loaded into it by the release's own parameter names
(every name must match), and its outputs on the conformance cases are recorded, in float32 and, where
the release computes in float64 too, float64. The test suite reads the results
(``conformance/test_original_d2l.py``); it never installs anything.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SIZES = dict(vocab_size=13, num_hiddens=8, ffn_num_hiddens=12, num_heads=2, num_blks=2, dropout=0.1, max_len=10)
SEED = 11
# The cases where the generations differ (lengths mixed, zero, per query, none) and the edges.
CASES = ("mixed_valid_lens", "valid_len_zero", "valid_lens_2d", "no_valid_lens", "edge_pred_positions", "max_len")
# (d2l release, framework, preset, the release's BERTModel built on SIZES)
RELEASES = [
    ("0.11.4", "mxnet", "d2l-0.11", "d2l.BERTModel(V, H, F, heads, blocks, dropout)"),
    ("0.14.4", "mxnet", "d2l-0.12", "d2l.BERTModel(V, H, F, heads, blocks, dropout, max_len)"),
    ("0.17.6", "mxnet", "d2l", "d2l.BERTModel(V, H, F, heads, blocks, dropout, max_len)"),
    ("0.17.6", "torch", "d2l", "d2l.BERTModel(V, H, [H], H, F, heads, blocks, dropout, max_len, H, H, H, H, H, H)"),
    ("1.0.3", "mxnet", "d2l", "d2l.BERTModel(V, H, F, heads, blocks, dropout, max_len)"),
    ("1.0.3", "torch", "d2l", "d2l.BERTModel(V, H, F, heads, blocks, dropout, max_len)"),
]
# Imported by d2l at module level, never by its BERT: stubbed in the child.
STUBBED = ("IPython", "pandas", "matplotlib_inline", "torchvision", "scipy", "gym")


def fixture_name(release: str, framework: str) -> str:
    return f"d2l-{release}-{framework}"


# --- The child: one release, one framework ------------------------------------------------------------


class _Stub(types.ModuleType):
    """A module, or anything taken from one: callable, indexable, and made of more stubs."""

    __path__: list[str] = []

    def __getattr__(self, name: str) -> _Stub:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs) -> _Stub:
        return _Stub(self.__name__)

    def __getitem__(self, key) -> _Stub:
        return _Stub(self.__name__)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Stub(spec.name)

    def exec_module(self, module):
        pass


def run_release(release: str, framework: str, preset: str, build: str, out: Path) -> None:
    """In the child: build the release's BERTModel, load the canonical weights by its names, record outputs."""
    sys.meta_path.insert(0, _StubFinder())
    from bert_multi import BERTConfig, load_weights
    from bert_multi.backend import framework_names
    from bert_multi.engine.cases import get_case

    d2l = importlib.import_module("d2l") if release.startswith("0.11") else None
    if d2l is None:
        d2l = importlib.import_module(f"d2l.{framework}")
    config, weights = load_weights(out.with_name(f"weights-{preset}.npz"))
    assert config == BERTConfig(**SIZES, semantics=preset)
    names = {
        "V": config.vocab_size,
        "H": config.num_hiddens,
        "F": config.ffn_num_hiddens,
        "heads": config.num_heads,
        "blocks": config.num_blks,
        "dropout": config.dropout,
        "max_len": config.max_len,
        "d2l": d2l,
    }
    backend = importlib.import_module(f"bert_multi.{framework}.backend")
    # The LayerNorm eps the release's framework really computes with (MXNet: a C float).
    arrays: dict[str, np.ndarray] = {"layer_norm_eps": np.array(backend.LAYER_NORM_EPS)}
    for dtype in ("float32", "float64"):
        batches = [(name, get_case(name).batch(config, SEED)) for name in CASES]
        try:
            run = _run_torch if framework == "torch" else _run_mxnet
            names["net"] = eval(build, names)
            outputs = run(names["net"], config, weights, dtype, batches, framework_names)
        except Exception as error:  # noqa: BLE001 - a release that cannot compute in float64 is recorded so
            if dtype == "float32":
                raise
            print(f"  {dtype}: not computed by this release ({type(error).__name__}: {error})")
            continue
        precision = dtype
        table = getattr(getattr(getattr(names["net"], "encoder", None), "pos_encoding", None), "P", None)
        if table is not None and str(table.dtype) != dtype:
            # d2l 0.11's sinusoidal table is a plain float32 array, not a parameter: cast() leaves it, so
            # even a float64 model adds positions rounded to float32.
            precision = str(table.dtype)
            print(f"  {dtype}: the positional table stays {precision}")
        arrays[f"precision/{dtype}"] = np.array(precision)
        for (case, batch), values in zip(batches, outputs):
            arrays.update({f"{case}/inputs/{k}": v for k, v in batch.items() if v is not None})
            arrays.update({f"{case}/{dtype}/{k}": v for k, v in values.items() if v is not None})
    with open(out, "wb") as file:
        np.savez_compressed(file, **arrays)


def _run_torch(net, config, weights, dtype, batches, framework_names):
    import torch

    net.eval()  # dropout off, as in inference
    if dtype == "float64":
        net.double()
    first = batches[0][1]
    net(*(torch.from_numpy(first[k]) for k in ("tokens", "segments", "valid_lens", "pred_positions")))  # lazy shapes
    names = framework_names(config, [])  # PyTorch's names are the canonical ones
    state = {names[name]: torch.from_numpy(array.astype(dtype)) for name, array in weights.items()}
    net.load_state_dict(state, strict=True)
    outputs = []
    with torch.no_grad():
        for _, batch in batches:
            tensors = [None if batch[k] is None else torch.from_numpy(batch[k]) for k in
                       ("tokens", "segments", "valid_lens", "pred_positions")]  # fmt: skip
            encoded, mlm, nsp = net(*tensors)
            outputs.append(
                {"encoded": encoded.numpy(), "mlm": None if mlm is None else mlm.numpy(), "nsp": nsp.numpy()}
            )
    return outputs


def _run_mxnet(net, config, weights, dtype, batches, framework_names):
    import mxnet as mx

    from bert_multi.mxnet import NAME_RULES

    def arrays(batch, data_dtype):  # MXNet's masks want valid_lens in the data's dtype, as d2l passes them
        return [
            None
            if batch[k] is None
            else mx.np.array(batch[k], dtype=data_dtype if k == "valid_lens" else batch[k].dtype)
            for k in ("tokens", "segments", "valid_lens", "pred_positions")
        ]

    net.initialize()
    net(*arrays(batches[0][1], "float32"))  # deferred shapes are known after a first forward
    net.cast(dtype)
    params = net._collect_params_with_prefix()
    names = framework_names(config, NAME_RULES)
    if set(params) != set(names.values()):
        raise SystemExit(
            f"the release's parameters differ from bert_multi's mapping: {set(params) ^ set(names.values())}"
        )
    for name, array in weights.items():
        params[names[name]].set_data(mx.np.array(array, dtype=dtype))
    outputs = []
    for _, batch in batches:  # outside autograd.record(): dropout off
        encoded, mlm, nsp = net(*arrays(batch, dtype))
        outputs.append(
            {"encoded": encoded.asnumpy(), "mlm": None if mlm is None else mlm.asnumpy(), "nsp": nsp.asnumpy()}
        )
    return outputs


# --- The parent: install each release, run it, keep the results --------------------------------------


def main() -> None:
    from bert_multi import BERTConfig, random_weights, save_weights

    for preset in sorted({preset for _, _, preset, _ in RELEASES}):
        config = BERTConfig(**SIZES, semantics=preset)
        save_weights(HERE / f"weights-{preset}.npz", config, random_weights(config, seed=SEED, dtype="float64"))
    for release, framework, preset, build in RELEASES:
        print(f"d2l {release} ({framework}):")
        with tempfile.TemporaryDirectory() as directory:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--no-deps",
                    "--target",
                    directory,
                    f"d2l=={release}",
                ],
                check=True,
            )
            child = [sys.executable, __file__, "--child", release, framework, preset, build]
            subprocess.run(child, check=True, env={**_environment(), "PYTHONPATH": directory})
        path = HERE / f"{fixture_name(release, framework)}.npz"
        print(f"  wrote {path.name} ({path.stat().st_size / 1024:.0f} KiB)")


def _environment() -> dict[str, str]:
    import os

    return dict(os.environ)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=4, metavar=("RELEASE", "FRAMEWORK", "PRESET", "BUILD"))
    args = parser.parse_args()
    if args.child:
        release, framework, preset, build = args.child
        run_release(release, framework, preset, build, HERE / f"{fixture_name(release, framework)}.npz")
    else:
        main()
