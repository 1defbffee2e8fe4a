"""Checkpoints saved by the ORIGINAL d2l 0.17.6 Paddle code (``d2l/paddle.py``, the code of d2l-zh 2.0)
the way its users save them; and a checker that loads bert_multi's conversions back into that code.

    .venv/bin/python conformance/original_d2l/paddle_checkpoints.py --paddle-python PYTHON [--paddle3-python PYTHON3]
        write checkpoints/*.pdparams and checkpoints/pretrained-paddle (the fixtures); with PYTHON3 (a Python
        with PaddlePaddle 3 and NumPy 2), paddle3.pdparams too: Paddle 2.6's file loaded and saved again
    .venv/bin/python conformance/original_d2l/paddle_checkpoints.py --paddle-python PYTHON --check
        convert each fixture with bert-multi convert to a .pdparams, load it in d2l 0.17.6's BERTModel
        (paddle.load, set_state_dict) and compare its outputs with those generate.py recorded

PYTHON is a Python with PaddlePaddle 2.6 (generate.py's docstring says how to make one); PYTHON3 one with
PaddlePaddle 3 (``python3 -m venv /tmp/paddle3 && /tmp/paddle3/bin/pip install paddlepaddle==3.3.1``, which
brings NumPy 2). Like
generate.py, this installs ``d2l==0.17.6`` with ``--no-deps`` into a throw-away directory and runs a child
there. The model is generate.py's (SIZES, the canonical ``weights-d2l.npz``, loaded by Paddle's own
names, its Linear weights transposed as Paddle's own layers say), so every file holds numbers whose
outputs are recorded in ``d2l-0.17.6-paddle.npz``. The suite (``conformance/test_paddle_checkpoints.py``)
reads the files; it never installs anything.
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
RELEASE = "0.17.6"
# file -> what the user did; the suite asserts what each one reads as.
FILES = {
    "d2l-0.17.6-paddle.pdparams": "paddle.save(net.state_dict(), path): the happy path (generate.py's list)",
    "pretrained-paddle": "d2l's pretrained-model directory as bert.small.paddle.zip holds it: pretrained.pdparams",
    "wrapped.pdparams": "paddle.save({'model': net.state_dict(), 'epoch': 3}): each tensor a (name, array) tuple",
    "protocol2.pdparams": "paddle.save(net.state_dict(), path, protocol=2): bytes spelled through _codecs",
    "bfloat16.pdparams": "paddle.save({k: v.astype('bfloat16') ...}): bfloat16, which Paddle saves as uint16",
    "classifier.pdparams": "the fine-tuning section's BERTClassifier(net): encoder, hidden, output",
    "paddle3.pdparams": "paddle.save(paddle.load(path), ...) by Paddle 3 on NumPy 2, as a user upgrading re-saves",
}


def _setup():
    """In the child: d2l's Paddle module, SIZES' model with the canonical weights, the recorded batch."""
    sys.path.insert(0, str(HERE))
    from checkpoints import VOCAB, _child_setup
    from generate import CASES, RELEASES, _run_paddle, release_names

    _, config, weights, batch = _child_setup()  # first: it stubs what d2l imports and BERT never uses
    from bert_multi.backend import framework_names

    d2l = importlib.import_module("d2l.paddle")
    (build,) = [build for release, framework, _, build in RELEASES if framework == "paddle"]
    names = release_names(config, d2l)

    def make():
        return eval(build, names)

    net = make()
    _run_paddle(net, config, weights, "float32", [(CASES[0], batch)], framework_names)
    return d2l, make, net, batch, VOCAB


def write() -> None:
    import paddle
    from paddle import nn

    d2l, _, net, batch, vocab = _setup()
    paddle.seed(0)  # the classifier's task head: the same bytes every run
    state = net.state_dict()
    paddle.save(state, str(OUT / f"d2l-{RELEASE}-paddle.pdparams"))
    paddle.save({"model": state, "epoch": 3}, str(OUT / "wrapped.pdparams"))
    paddle.save(state, str(OUT / "protocol2.pdparams"), protocol=2)
    paddle.save({name: value.astype("bfloat16") for name, value in state.items()}, str(OUT / "bfloat16.pdparams"))

    class BERTClassifier(nn.Layer):  # as d2l 0.17's Paddle natural-language-inference-bert section defines it
        def __init__(self, bert):
            super().__init__()
            self.encoder = bert.encoder
            self.hidden = bert.hidden
            self.output = nn.Linear(net.hidden[0].weight.shape[1], 3)

        def forward(self, inputs):
            tokens_X, segments_X, valid_lens_x = inputs
            encoded_X = self.encoder(tokens_X, segments_X, valid_lens_x)
            return self.output(self.hidden(encoded_X[:, 0, :]))

    paddle.save(BERTClassifier(net).state_dict(), str(OUT / "classifier.pdparams"))
    directory = OUT / "pretrained-paddle"
    directory.mkdir(exist_ok=True)
    paddle.save(state, str(directory / "pretrained.pdparams"))
    (directory / "vocab.json").write_text(json.dumps(vocab))


def resave() -> None:
    """In Paddle 3's child: the happy path's file loaded and saved again (NumPy 2 names its recipe
    ``numpy._core``)."""
    import paddle

    paddle.save(paddle.load(str(OUT / f"d2l-{RELEASE}-paddle.pdparams")), str(OUT / "paddle3.pdparams"))


def check(converted: Path) -> None:
    """Load each converted file in d2l 0.17.6's Paddle BERTModel; compare with the recorded outputs."""
    import paddle

    _, make, _, batch, _ = _setup()
    recorded = np.load(HERE / f"d2l-{RELEASE}-paddle.npz", allow_pickle=False)
    inputs = [paddle.to_tensor(batch[k]) for k in ("tokens", "segments", "valid_lens", "pred_positions")]
    for path in sorted(converted.glob("*.pdparams")) + sorted(converted.glob("*/pretrained.pdparams")):
        net = make()
        net.eval()
        state = paddle.load(str(path))
        if {n: list(v.shape) for n, v in net.state_dict().items()} != {n: list(v.shape) for n, v in state.items()}:
            raise SystemExit(f"{path}: its names or shapes are not those of d2l's Paddle BERTModel")
        net.set_state_dict(state)
        with paddle.no_grad():
            encoded = net(*inputs)[0].numpy()
        error = float(np.abs(encoded - recorded["mixed_valid_lens/float32/encoded"]).max())
        rounded = " (from bfloat16 weights)" if "bfloat16" in path.name else ""
        print(
            f"  {path.relative_to(converted)}: loaded by name and shape, max abs error vs the recorded outputs "
            f"{error:.2e}{rounded}"
        )
        if error > 1e-5 and not rounded:
            raise SystemExit(f"{path}: outputs differ from the original's by {error}")


def _in_release(python: str, *child_args: str) -> None:
    sys.path.insert(0, str(HERE))
    from generate import in_release

    in_release(RELEASE, python, __file__, *child_args)


def _convert_all(scratch: Path) -> Path:
    """Every Paddle fixture converted by bert-multi to a .pdparams of d2l's names (classifiers aside)."""
    bert_multi = Path(sys.executable).with_name("bert-multi")
    converted = scratch / "converted"
    converted.mkdir()
    for source in [*sorted(OUT.glob("*.pdparams")), OUT / "pretrained-paddle"]:
        if "classifier" in source.name:
            continue  # encoder and pooler only, which no BERTModel loads whole
        statements = ["--num-heads", "2", "--d2l-version", RELEASE]
        statements += ["--key", "model"] if source.name == "wrapped.pdparams" else []
        statements += ["--cast", "float32"] if source.name == "bfloat16.pdparams" else []
        target = converted / f"{source.name.replace('.', '-')}.pdparams"
        subprocess.run([str(bert_multi), "convert", str(source), str(target), *statements], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
    from checkpoints import VOCAB  # beside this file, as generate.py

    vocab = scratch / "vocab.json"
    vocab.write_text(json.dumps(VOCAB))
    for source in ("state_dict.pt", "model.params"):  # d2l 1.0.3's files, the same weights, to Paddle's
        stem = converted / source.replace(".", "-")
        for target, extra in ((f"{stem}.pdparams", []), (stem, ["--framework", "paddle", "--vocab", str(vocab)])):
            subprocess.run([str(bert_multi), "convert", str(OUT / source), str(target), "--num-heads", "2",
                            "--d2l-version", "1.0.3", *extra], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    return converted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paddle-python", metavar="PYTHON", help="a Python with PaddlePaddle 2.6")
    parser.add_argument("--paddle3-python", metavar="PYTHON3", help="a Python with PaddlePaddle 3 and NumPy 2")
    parser.add_argument("--check", action="store_true", help="convert the fixtures and load them in d2l 0.17.6")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        {"write": write, "resave": resave}[args.child[0]]() if len(args.child) == 1 else check(Path(args.child[1]))
        return
    if args.paddle_python is None:
        parser.error("d2l's Paddle code needs a Python with PaddlePaddle: --paddle-python PYTHON")
    if not args.check:
        _in_release(args.paddle_python, "write")
        if args.paddle3_python:  # needs no d2l: a file loaded and saved
            subprocess.run([args.paddle3_python, __file__, "--child", "resave"], check=True)
        total = sum((OUT / name).stat().st_size for name in FILES if (OUT / name).is_file())
        print(f"wrote {len(FILES)} Paddle fixtures to {OUT} ({total / 1024:.0f} KiB, the directory aside)")
        return
    with tempfile.TemporaryDirectory() as scratch:
        converted = _convert_all(Path(scratch))
        print(f"d2l {RELEASE} (Paddle): bert_multi's conversions of every fixture")
        _in_release(args.paddle_python, "check", str(converted))


if __name__ == "__main__":
    main()
