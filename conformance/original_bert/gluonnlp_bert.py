"""A BERT saved by GluonNLP's own ``BERTModel`` (as its model zoo's BERTs are saved), and what GluonNLP
computes with it: the fixtures of ``conformance/test_gluonnlp_checkpoints.py``, which only reads them.

    .venv/bin/python conformance/original_bert/gluonnlp_bert.py     write checkpoints/gluonnlp-bert.*

Like the d2l fixtures' generators, it fetches the release (GluonNLP 0.10.0, the last for MXNet 1.x) with
``pip download`` into a throw-away directory and imports it from there, in the project's MXNet
environment. The release is a source archive whose tokenizer is compiled C; BERT never uses it, so a
stub stands in for it. Written:

- ``checkpoints/gluonnlp-bert.params``: ``BERTModel.save_parameters`` of a toy BERT (the sizes of
  ``tf_checkpoints.py``'s, LayerNorm eps 1e-12 as GluonNLP's BERTs have), its parameters drawn at random;
- ``checkpoints/gluonnlp-bert.npz``: the inputs, and GluonNLP's outputs in float32 (the only dtype its
  fused attention computes on a CPU): the encoding, the pooler's output, the NSP and MLM logits;
- ``checkpoints/gluonnlp-classifier.params``: what GluonNLP's fine-tuning scripts save, a
  ``BERTClassifier`` (3 classes, dropout 0.1) around a BERTModel without its pretraining heads, whose
  encoding and pooler's output are the last two outputs of the ``.npz`` (``classifier/...``).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "checkpoints"
RELEASE = "gluonnlp==0.10.0"
SIZES = {"vocab_size": 13, "units": 8, "hidden_size": 12, "num_heads": 2, "num_layers": 2, "max_length": 16}


def import_gluonnlp(directory: Path) -> None:
    """GluonNLP's source, fetched into ``directory`` and importable, its compiled tokenizer stubbed."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(directory), RELEASE],
        check=True,
    )
    with tarfile.open(next(directory.glob("gluonnlp-*.tar.gz"))) as archive:
        archive.extractall(directory, filter="data")
    source = next(directory.glob("gluonnlp-*/src"))
    stub = (
        "def is_control(c):\n    return False\n\n\nis_punctuation = is_whitespace = is_control\n"
        "BasicTokenizer = WordpieceTokenizer = object\n"
    )
    (source / "gluonnlp" / "data" / "fast_bert_tokenizer.py").write_text(stub)
    sys.path.insert(0, str(source))


def main() -> None:
    import mxnet as mx

    with tempfile.TemporaryDirectory() as directory:
        import_gluonnlp(Path(directory))
        from gluonnlp.model.bert import BERTClassifier, BERTEncoder, BERTModel

        mx.random.seed(0)
        encoder = BERTEncoder(
            num_layers=SIZES["num_layers"], units=SIZES["units"], hidden_size=SIZES["hidden_size"],
            max_length=SIZES["max_length"], num_heads=SIZES["num_heads"], dropout=0.0, layer_norm_eps=1e-12,
        )  # fmt: skip
        model = BERTModel(
            encoder, vocab_size=SIZES["vocab_size"], token_type_vocab_size=2, units=SIZES["units"],
            embed_size=SIZES["units"],
        )  # fmt: skip
        model.initialize(mx.init.Normal(0.5))
        rng = np.random.default_rng(0)
        inputs = {
            "tokens": rng.integers(0, SIZES["vocab_size"], (3, 7)),
            "segments": np.array([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0, 0], [0] * 7]),
            "valid_lens": np.array([7, 5, 2]),  # a full row, and two padded ones
            "pred_positions": np.array([[1, 2], [0, 4], [0, 1]]),
        }
        encoded, pooled, nsp, mlm = (
            out.asnumpy() for out in model(*(mx.nd.array(inputs[name], dtype="float32") for name in inputs))
        )
        model.save_parameters(str(OUT / "gluonnlp-bert.params"))
        bare = BERTModel(
            BERTEncoder(
                num_layers=SIZES["num_layers"], units=SIZES["units"], hidden_size=SIZES["hidden_size"],
                max_length=SIZES["max_length"], num_heads=SIZES["num_heads"], dropout=0.0, layer_norm_eps=1e-12,
            ),
            vocab_size=SIZES["vocab_size"], token_type_vocab_size=2, units=SIZES["units"], embed_size=SIZES["units"],
            use_decoder=False, use_classifier=False,
        )  # fmt: skip
        classifier = BERTClassifier(bare, num_classes=3, dropout=0.1)
        classifier.initialize(mx.init.Normal(0.5))
        arrays = [mx.nd.array(inputs[name], dtype="float32") for name in ("tokens", "segments", "valid_lens")]
        classifier(*arrays)  # its head's input width is known after a first forward
        encoded_fine, pooled_fine = (out.asnumpy() for out in bare(*arrays))
        classifier.save_parameters(str(OUT / "gluonnlp-classifier.params"))
    outputs = {"encoded": encoded, "pooled": pooled, "nsp": nsp, "mlm": mlm}
    outputs.update({"classifier/encoded": encoded_fine, "classifier/pooled": pooled_fine})
    arrays = {f"inputs/{name}": array for name, array in inputs.items()}
    np.savez(OUT / "gluonnlp-bert.npz", **arrays, **{f"outputs/{name}": array for name, array in outputs.items()})
    for path in (OUT / "gluonnlp-bert.params", OUT / "gluonnlp-bert.npz", OUT / "gluonnlp-classifier.params"):
        print(f"{path.name}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
