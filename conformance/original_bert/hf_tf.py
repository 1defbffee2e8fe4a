"""BERTs saved by transformers' own TensorFlow classes (``save_pretrained`` writes ``config.json`` and
``tf_model.h5``, Keras's HDF5 weights file), and what transformers computes from them: the fixtures of
``conformance/test_old_huggingface_checkpoints.py``, which only reads them.

    python conformance/original_bert/hf_tf.py      write checkpoints/tf-*/ and checkpoints/tf.npz

transformers 5 dropped its TensorFlow classes, so directories saved by them load in no transformers of
today. This needs a transformers of before 5.0 with TensorFlow and Keras 2, which none of the project's
environments holds; a throw-away one does, with no network beyond the package index:

    python3 -m venv /tmp/hftf && /tmp/hftf/bin/pip install tensorflow-cpu==2.21.0 tf-keras 'transformers<5' \
        torch==2.13.0

The model is ``tf_checkpoints.py``'s toy BERT, every weight drawn at random. Written:

- ``tf-pretraining/``: a ``TFBertForPreTraining``, its MLM decoder tied to the word embeddings (Keras
  saves the shared embeddings twice, under the encoder's layer and the MLM head's);
- ``tf-classifier/``: a ``TFBertForSequenceClassification`` (3 labels) of one block, smaller;
- ``tf-safetensors/``: ``tf-pretraining/``'s model saved with ``safe_serialization=True``: a
  ``model.safetensors`` of TensorFlow's names and (in, out) kernels, its metadata's format ``tf``;
- ``tf.npz``: the inputs, and two sets of outputs of ``tf-pretraining/`` (encoding, MLM logits at the
  predicted positions, NSP logits): ``keras/...``, the TensorFlow model's own in float32, and
  ``torch/...``, in float64, the PyTorch model transformers builds from the directory with its
  ``load_tf2_checkpoint_in_pytorch_model`` (what ``from_pretrained(from_tf=True)`` calls: its own name
  mapping, not bert_multi's); and ``classifier/encoded``, that of ``tf-classifier/``'s encoder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
from toy_bert import CONFIG, INPUTS, attention_mask, pytorch_outputs

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # transformers' TensorFlow classes are Keras 2's

OUT = Path(__file__).resolve().parent / "checkpoints"


def built(model, rng: np.random.Generator):
    """``model`` built on its dummy inputs, every weight drawn from N(0, 0.5)."""
    model(model.dummy_inputs)
    model.set_weights([rng.normal(0, 0.5, weight.shape).astype(np.float32) for weight in model.get_weights()])
    return model


def keras_outputs(model) -> dict[str, np.ndarray]:
    """The TensorFlow ``TFBertForPreTraining``'s own outputs, float32, at ``INPUTS``."""
    out = model(INPUTS["tokens"], attention_mask=attention_mask(), token_type_ids=INPUTS["segments"],
                output_hidden_states=True)  # fmt: skip
    rows = np.arange(INPUTS["tokens"].shape[0])[:, None]
    return {
        "encoded": out.hidden_states[-1].numpy(),
        "mlm": out.prediction_logits.numpy()[rows, INPUTS["pred_positions"]],
        "nsp": out.seq_relationship_logits.numpy(),
    }


def torch_outputs(directory: Path, cls_name: str) -> dict[str, np.ndarray]:
    """What transformers' PyTorch BERT computes in float64 from the TensorFlow directory, by its own loader."""
    import transformers
    from transformers.modeling_tf_pytorch_utils import load_tf2_checkpoint_in_pytorch_model

    config = transformers.BertConfig.from_pretrained(directory, attn_implementation="eager")
    model = getattr(transformers, cls_name)(config)
    return pytorch_outputs(load_tf2_checkpoint_in_pytorch_model(model, str(directory / "tf_model.h5")))


def main() -> None:
    import transformers

    rng = np.random.default_rng(0)
    pretraining = built(transformers.TFBertForPreTraining(transformers.BertConfig(**CONFIG)), rng)
    one_block = transformers.BertConfig(**{**CONFIG, "num_hidden_layers": 1}, num_labels=3)
    classifier = built(transformers.TFBertForSequenceClassification(one_block), rng)
    arrays = {f"inputs/{name}": array for name, array in INPUTS.items()}
    arrays.update({f"keras/{name}": array for name, array in keras_outputs(pretraining).items()})
    for case, model in {
        "tf-pretraining": pretraining,
        "tf-classifier": classifier,
        "tf-safetensors": pretraining,
    }.items():
        shutil.rmtree(OUT / case, ignore_errors=True)
        model.save_pretrained(OUT / case, safe_serialization=case == "tf-safetensors")
        print(f"{case}: {sorted((path.name, path.stat().st_size) for path in (OUT / case).iterdir())}")
    found = torch_outputs(OUT / "tf-pretraining", "BertForPreTraining")
    arrays.update({f"torch/{name}": array for name, array in found.items()})
    found = torch_outputs(OUT / "tf-classifier", "BertForSequenceClassification")
    arrays["classifier/encoded"] = found["encoded"]
    np.savez(OUT / "tf.npz", **arrays)
    print(f"tf.npz: {(OUT / 'tf.npz').stat().st_size} bytes")


if __name__ == "__main__":
    main()
