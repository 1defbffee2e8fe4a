"""Golden fixtures computed by the ORIGINAL d2l releases: every generation, every framework.

    .venv/bin/python conformance/original_d2l/generate.py --paddle-python PYTHON   (from the repository root)
    .venv/bin/python conformance/original_d2l/generate.py --only paddle --paddle-python PYTHON

d2l 0.17's Paddle code runs in a Python of its own (``--paddle-python``), one with PaddlePaddle 2.6, the
last release before Paddle 3 refused to compare d2l's float32 positions with int64 lengths:

    python3 -m venv /tmp/paddle && /tmp/paddle/bin/pip install paddlepaddle==2.6.2 "numpy<2"

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
import os
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
    ("0.17.6", "paddle", "d2l", "d2l.BERTModel(V, H, [H], H, F, heads, blocks, dropout, max_len, H, H, H, H, H, H)"),
]
PADDLE_LAYER_NORM_EPS = float(np.float32(1e-5))  # Paddle's layer_norm takes its epsilon as a C float
# Imported by d2l at module level, never by its BERT: stubbed in the child.
STUBBED = ("IPython", "pandas", "matplotlib", "matplotlib_inline", "torchvision", "scipy", "gym", "requests")


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


def release_names(config, d2l) -> dict:
    """The names a release's ``build`` expression (``RELEASES``) is written in, for ``config`` and its d2l."""
    return {
        "V": config.vocab_size,
        "H": config.num_hiddens,
        "F": config.ffn_num_hiddens,
        "heads": config.num_heads,
        "blocks": config.num_blks,
        "dropout": config.dropout,
        "max_len": config.max_len,
        "d2l": d2l,
    }


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
    names = release_names(config, d2l)
    # The LayerNorm eps the release's framework really computes with (MXNet's and Paddle's: a C float).
    eps = (
        PADDLE_LAYER_NORM_EPS
        if framework == "paddle"
        else (importlib.import_module(f"bert_multi.{framework}.backend").LAYER_NORM_EPS)
    )
    arrays: dict[str, np.ndarray] = {"layer_norm_eps": np.array(eps)}
    for dtype in ("float32", "float64"):
        batches = [(name, get_case(name).batch(config, SEED)) for name in CASES]
        try:
            run = {"torch": _run_torch, "mxnet": _run_mxnet, "paddle": _run_paddle}[framework]
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
        if framework == "paddle" and dtype == "float64":
            # d2l's Paddle sequence_mask casts the scores to float32 to mask them, and back.
            precision = "float32"
            print(f"  {dtype}: sequence_mask rounds the attention scores to float32")
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
    with torch.no_grad():
        return _outputs(net, batches, torch.from_numpy)


def _outputs(net, batches, to_tensor) -> list[dict]:
    """What ``net`` computes on each batch, its inputs made tensors by ``to_tensor`` (PyTorch's and Paddle's
    tensors both give NumPy back by ``.numpy()``)."""
    outputs = []
    for _, batch in batches:
        tensors = [None if batch[k] is None else to_tensor(batch[k]) for k in
                   ("tokens", "segments", "valid_lens", "pred_positions")]  # fmt: skip
        encoded, mlm, nsp = net(*tensors)
        outputs.append({"encoded": encoded.numpy(), "mlm": None if mlm is None else mlm.numpy(), "nsp": nsp.numpy()})
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


def _run_paddle(net, config, weights, dtype, batches, framework_names):
    import paddle

    net.eval()  # dropout off, as in inference
    if dtype == "float64":
        net.to(dtype="float64")
    names = framework_names(config, [])  # Paddle's d2l names are PyTorch's
    # Paddle's own layers say which weights are Linear ones, held (in, out): those are transposed.
    linear = {f"{prefix}.weight" for prefix, layer in net.named_sublayers() if isinstance(layer, paddle.nn.Linear)}
    state = {names[n]: (a.T if names[n] in linear else a).astype(dtype) for n, a in weights.items()}
    own = net.state_dict()
    if {name: list(value.shape) for name, value in own.items()} != {n: list(a.shape) for n, a in state.items()}:
        raise SystemExit("the release's parameters differ from bert_multi's names or shapes")
    net.set_state_dict(state)
    with paddle.no_grad():
        return _outputs(net, batches, paddle.to_tensor)


# --- The parent: install each release, run it, keep the results --------------------------------------


def main(only: list[str] | None, paddle_python: str | None) -> None:
    from bert_multi import BERTConfig, random_weights, save_weights

    if only is None:  # the weights every fixture was computed from: rewritten only with every fixture
        for preset in sorted({preset for _, _, preset, _ in RELEASES}):
            config = BERTConfig(**SIZES, semantics=preset)
            save_weights(HERE / f"weights-{preset}.npz", config, random_weights(config, seed=SEED, dtype="float64"))
    for release, framework, preset, build in RELEASES:
        if only is not None and framework not in only:
            continue
        python = paddle_python if framework == "paddle" else sys.executable
        if python is None:
            raise SystemExit("d2l's Paddle release needs a Python with PaddlePaddle: --paddle-python PYTHON")
        print(f"d2l {release} ({framework}):")
        in_release(release, python, __file__, release, framework, preset, build)
        path = HERE / f"{fixture_name(release, framework)}.npz"
        print(f"  wrote {path.name} ({path.stat().st_size / 1024:.0f} KiB)")


def in_release(version: str, python: str, script: str, *child_args: str) -> None:
    """Run ``script --child CHILD_ARGS`` in ``python``, with ``d2l==version`` (installed with ``--no-deps`` into
    a throw-away directory) and bert_multi's source importable: how each generator here runs a release."""
    with tempfile.TemporaryDirectory() as directory:
        install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", directory]
        subprocess.run([*install, f"d2l=={version}"], check=True)
        path = os.pathsep.join([directory, str(HERE.parent.parent)])
        subprocess.run([python, script, "--child", *child_args], check=True, env={**os.environ, "PYTHONPATH": path})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=4, metavar=("RELEASE", "FRAMEWORK", "PRESET", "BUILD"))
    parser.add_argument("--only", nargs="+", metavar="FRAMEWORK", help="regenerate only these frameworks' fixtures")
    parser.add_argument("--paddle-python", metavar="PYTHON", help="a Python with PaddlePaddle 2.6 (see above)")
    args = parser.parse_args()
    if args.child:
        release, framework, preset, build = args.child
        run_release(release, framework, preset, build, HERE / f"{fixture_name(release, framework)}.npz")
    else:
        main(args.only, args.paddle_python)
