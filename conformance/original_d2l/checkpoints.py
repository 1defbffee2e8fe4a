"""Checkpoints saved by the ORIGINAL d2l code: by d2l 1.0.3 the way its users save them, mistakes
included, and by every release of generate.py's list in its own format (``d2l-RELEASE-FRAMEWORK.pt``
or ``.params``); and a checker that loads bert_multi's converted files back into d2l 1.0.3 with its
own strict calls.

    .venv/bin/python conformance/original_d2l/checkpoints.py            write checkpoints/ (the fixtures)
    .venv/bin/python conformance/original_d2l/checkpoints.py --check    convert each fixture with
        bert-multi convert, load the results in d2l 1.0.3 (load_state_dict(strict=True), load_parameters)
        and compare its outputs with the fixture outputs of generate.py

Like generate.py, it installs ``d2l==1.0.3`` with ``--no-deps`` into a throw-away directory and runs
a child in which it is importable. The model is generate.py's (SIZES, the canonical ``weights-d2l.npz``
loaded by the release's own names), so every file holds numbers whose outputs are already recorded.
The suite (``conformance/test_original_checkpoints.py``) reads the files; it never installs anything.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "checkpoints"
RELEASE = "1.0.3"
VOCAB = ["<unk>", "<pad>", "<cls>", "<sep>", "<mask>", *(f"w{i}" for i in range(8))]  # SIZES' 13 tokens
# file -> what the user did (torch); the suite asserts what each one reads as.
TORCH_FILES = {
    "state_dict.pt": "torch.save(net.state_dict()) after training: the happy path",
    "lazy.pt": "torch.save(net.state_dict()) before the first forward (LazyLinear uninitialised)",
    "module.pt": "torch.save(net): the whole module pickled",
    "wrapped.pt": "torch.save({'model': net.state_dict(), 'epoch': 3})",
    "dataparallel.pt": "torch.save(nn.DataParallel(net).state_dict()): every name under 'module.'",
    "compiled.pt": "torch.save(torch.compile(net).state_dict()): every name under '_orig_mod.'",
    "classifier.pt": "the fine-tuning section's BERTClassifier(net): encoder, hidden, output",
    "half.pt": "torch.save({k: v.half() ...}): float16",
    "bfloat16.pt": "torch.save({k: v.bfloat16() ...}): bfloat16",
    "pretrained-torch": "d2l's pretrained-model directory: pretrained.params (torch.save) + vocab.json",
}
MXNET_FILES = {
    "model.params": "net.save_parameters(path): the happy path",
    "classifier.params": "the fine-tuning section's BERTClassifier(net).save_parameters(path)",
    "pretrained-mxnet": "d2l's pretrained-model directory: pretrained.params (save_parameters) + vocab.json",
}


def _child_setup():
    sys.path.insert(0, str(HERE))
    from generate import SEED, SIZES, _StubFinder

    sys.meta_path.insert(0, _StubFinder())
    from bert_multi import load_weights
    from bert_multi.engine.cases import get_case

    config, weights = load_weights(HERE / "weights-d2l.npz")
    batch = get_case("mixed_valid_lens").batch(config, SEED)
    return SIZES, config, weights, batch


def write_torch() -> None:
    import torch
    from torch import nn

    sizes, config, weights, batch = _child_setup()  # first: it stubs what d2l imports and BERT never uses
    d2l = importlib.import_module("d2l.torch")
    torch.manual_seed(0)  # the classifier's task head and the unsaved lazy model: the same bytes every run
    OUT.mkdir(exist_ok=True)

    def make():
        return d2l.BERTModel(*(sizes[k] for k in ("vocab_size", "num_hiddens", "ffn_num_hiddens", "num_heads",
                                                  "num_blks", "dropout", "max_len")))  # fmt: skip

    def forward(net):
        net(*(torch.from_numpy(batch[k]) for k in ("tokens", "segments", "valid_lens", "pred_positions")))

    torch.save(make().state_dict(), OUT / "lazy.pt")
    net = make().eval()
    forward(net)
    net.load_state_dict({name: torch.from_numpy(array) for name, array in weights.items()}, strict=True)
    state = net.state_dict()
    torch.save(state, OUT / "state_dict.pt")
    torch.save(net, OUT / "module.pt")
    torch.save({"model": state, "epoch": 3}, OUT / "wrapped.pt")
    torch.save(nn.DataParallel(net).state_dict(), OUT / "dataparallel.pt")
    torch.save(torch.compile(net).state_dict(), OUT / "compiled.pt")
    torch.save({name: value.half() for name, value in state.items()}, OUT / "half.pt")
    torch.save({name: value.bfloat16() for name, value in state.items()}, OUT / "bfloat16.pt")

    class BERTClassifier(nn.Module):  # as d2l 1.0's natural-language-inference-bert section defines it
        def __init__(self, bert):
            super().__init__()
            self.encoder = bert.encoder
            self.hidden = bert.hidden
            self.output = nn.LazyLinear(3)

        def forward(self, inputs):
            tokens_X, segments_X, valid_lens_x = inputs
            encoded_X = self.encoder(tokens_X, segments_X, valid_lens_x)
            return self.output(self.hidden(encoded_X[:, 0, :]))

    classifier = BERTClassifier(net)
    classifier([torch.from_numpy(batch[k]) for k in ("tokens", "segments", "valid_lens")])
    torch.save(classifier.state_dict(), OUT / "classifier.pt")
    directory = OUT / "pretrained-torch"
    directory.mkdir(exist_ok=True)
    torch.save(state, directory / "pretrained.params")
    (directory / "vocab.json").write_text(json.dumps(VOCAB))


def write_mxnet() -> None:
    import mxnet as mx
    from mxnet.gluon import nn

    sizes, config, weights, batch = _child_setup()  # first: it stubs what d2l imports and BERT never uses
    d2l = importlib.import_module("d2l.mxnet")
    mx.random.seed(0)  # the classifier's task head: the same bytes every run
    from bert_multi.backend import framework_names
    from bert_multi.mxnet import NAME_RULES

    mx.npx.set_np()
    net = d2l.BERTModel(*(sizes[k] for k in ("vocab_size", "num_hiddens", "ffn_num_hiddens", "num_heads",
                                             "num_blks", "dropout", "max_len")))  # fmt: skip
    net.initialize()
    inputs = [mx.np.array(batch[k], dtype="float32" if k == "valid_lens" else batch[k].dtype)
              for k in ("tokens", "segments", "valid_lens", "pred_positions")]  # fmt: skip
    net(*inputs)
    params = net._collect_params_with_prefix()
    for name, gluon_name in framework_names(config, NAME_RULES).items():
        params[gluon_name].set_data(mx.np.array(weights[name]))
    net.save_parameters(str(OUT / "model.params"))

    class BERTClassifier(nn.Block):  # as d2l 1.0's natural-language-inference-bert section defines it
        def __init__(self, bert):
            super().__init__()
            self.encoder = bert.encoder
            self.hidden = bert.hidden
            self.output = nn.Dense(3)

        def forward(self, inputs):
            tokens_X, segments_X, valid_lens_x = inputs
            encoded_X = self.encoder(tokens_X, segments_X, valid_lens_x)
            return self.output(self.hidden(encoded_X[:, 0, :]))

    classifier = BERTClassifier(net)
    classifier.output.initialize()
    classifier(inputs[:3])
    classifier.save_parameters(str(OUT / "classifier.params"))
    directory = OUT / "pretrained-mxnet"
    directory.mkdir(exist_ok=True)
    net.save_parameters(str(directory / "pretrained.params"))
    (directory / "vocab.json").write_text(json.dumps(VOCAB))


def write_release(release: str, framework: str, preset: str, build: str) -> None:
    """A checkpoint saved by one release of generate.py's list, in its own framework's format, of the
    weights whose outputs generate.py recorded for it."""
    sys.path.insert(0, str(HERE))
    from generate import CASES, SEED, _run_mxnet, _run_torch, _StubFinder, release_names

    sys.meta_path.insert(0, _StubFinder())
    from bert_multi import load_weights
    from bert_multi.backend import framework_names
    from bert_multi.engine.cases import get_case

    d2l = importlib.import_module("d2l" if release.startswith("0.11") else f"d2l.{framework}")
    config, weights = load_weights(HERE / f"weights-{preset}.npz")
    net = eval(build, release_names(config, d2l))
    batches = [(CASES[0], get_case(CASES[0]).batch(config, SEED))]
    (_run_torch if framework == "torch" else _run_mxnet)(net, config, weights, "float32", batches, framework_names)
    OUT.mkdir(exist_ok=True)
    if framework == "torch":
        import torch

        torch.save(net.state_dict(), OUT / f"d2l-{release}-torch.pt")
    else:
        net.save_parameters(str(OUT / f"d2l-{release}-mxnet.params"))


def check(framework: str, converted: Path) -> None:
    """Load each converted file in d2l 1.0.3 with its own strict call; compare its outputs with the
    original outputs generate.py recorded for the same weights."""
    sizes, config, weights, batch = _child_setup()
    recorded = np.load(HERE / f"d2l-{RELEASE}-{framework}.npz", allow_pickle=False)
    args = [
        sizes[k]
        for k in ("vocab_size", "num_hiddens", "ffn_num_hiddens", "num_heads", "num_blks", "dropout", "max_len")
    ]
    if framework == "torch":
        import torch

        d2l = importlib.import_module("d2l.torch")
        inputs = [torch.from_numpy(batch[k]) for k in ("tokens", "segments", "valid_lens", "pred_positions")]
        for path in sorted(converted.glob("*.pt")) + sorted(converted.glob("*/pretrained.params")):
            net = d2l.BERTModel(*args).eval()
            with torch.no_grad():
                net(*inputs)
                net.load_state_dict(torch.load(path, weights_only=True), strict=True)
                encoded = net(*inputs)[0].numpy()
            _report(path, encoded, recorded)
    else:
        import mxnet as mx

        mx.npx.set_np()
        d2l = importlib.import_module("d2l.mxnet")
        inputs = [mx.np.array(batch[k], dtype="float32" if k == "valid_lens" else batch[k].dtype)
                  for k in ("tokens", "segments", "valid_lens", "pred_positions")]  # fmt: skip
        for path in sorted(converted.glob("*.params")) + sorted(converted.glob("*/pretrained.params")):
            net = d2l.BERTModel(*args)
            net.load_parameters(str(path))  # Gluon's own strict call: no allow_missing, no ignore_extra
            _report(path, net(*inputs)[0].asnumpy(), recorded)


def _report(path: Path, encoded: np.ndarray, recorded) -> None:
    error = float(np.abs(encoded - recorded["mixed_valid_lens/float32/encoded"]).max())
    rounded = any(word in str(path) for word in ("half", "bfloat16"))  # weights rounded when saved
    note = " (from half-precision weights)" if rounded else ""
    print(f"  {path.parent.name}/{path.name}: loaded strictly, max abs error vs the recorded outputs {error:.2e}{note}")
    if error > 1e-5 and not rounded:
        raise SystemExit(f"{path}: outputs differ from the original's by {error}")


def _in_release(*child_args: str, version: str = RELEASE) -> None:
    sys.path.insert(0, str(HERE))
    from generate import in_release

    in_release(version, sys.executable, __file__, *child_args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="convert the fixtures and load them in d2l 1.0.3")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        action, framework, *rest = args.child
        if action == "write":
            (write_torch if framework == "torch" else write_mxnet)()
        elif action == "release":
            write_release(framework, *rest)
        else:
            check(framework, Path(rest[0]))
        return
    if not args.check:
        for framework in ("torch", "mxnet"):
            _in_release("write", framework)
        sys.path.insert(0, str(HERE))
        from generate import RELEASES

        for release, framework, preset, build in RELEASES:
            if framework != "paddle":  # paddle_checkpoints.py writes that one, in a Python with Paddle
                _in_release("release", release, framework, preset, build, version=release)
        total = sum(path.stat().st_size for path in OUT.rglob("*") if path.is_file())
        print(f"wrote {OUT} ({total / 1024:.0f} KiB)")
        return
    bert_multi = Path(sys.executable).with_name("bert-multi")
    with tempfile.TemporaryDirectory() as scratch:
        vocab = Path(scratch) / "vocab.json"
        vocab.write_text(json.dumps(VOCAB))
        for framework, suffix in (("torch", ".pt"), ("mxnet", ".params")):
            converted = Path(scratch) / framework
            converted.mkdir()
            for source in [*sorted(OUT.glob("*.pt")), *sorted(OUT.glob("*.params")), *sorted(OUT.glob("pretrained-*"))]:
                statements = ["--num-heads", "2", "--d2l-version", RELEASE]
                if source.name in ("half.pt", "bfloat16.pt"):
                    statements += ["--cast", "float32"]
                if source.name == "wrapped.pt":
                    statements += ["--key", "model"]
                if source.name in ("lazy.pt", "module.pt") or source.name.startswith("d2l-"):
                    continue  # no weights to convert (the suite checks their messages), or another release's
                stem = source.name.replace(".", "-")
                outputs = [converted / f"{stem}{suffix}"]
                if "classifier" not in source.name:
                    outputs.append(converted / f"{stem}-dir")
                for out in outputs:
                    extra = ["--framework", framework, "--vocab", str(vocab)] if out.suffix == "" else []
                    subprocess.run([str(bert_multi), "convert", str(source), str(out), *statements, *extra],
                                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
            print(f"d2l {RELEASE} {framework}: bert_multi's conversions of every fixture")
            converted_files = sorted(p.name for p in converted.iterdir())
            print(
                f"  {len(converted_files)} files; classifiers are encoder + pooler, which no BERTModel loads strictly"
            )
            for path in converted.glob("classifier*"):
                path.unlink()
            _in_release("check", framework, str(converted))


if __name__ == "__main__":
    main()
