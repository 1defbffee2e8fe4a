"""Checkpoints of Google's original BERT, saved by TensorFlow itself, and what transformers computes from
them: the fixtures of ``conformance/test_google_checkpoints.py``, which only reads them.

    python conformance/original_bert/tf_checkpoints.py      write checkpoints/ (the fixtures)

It needs TensorFlow, PyTorch and a transformers of before 5.0 (whose ``load_tf_weights_in_bert`` reads
Google's checkpoints with TensorFlow's own reader), none of which the project's environments hold; a
throw-away one does, with no network beyond the package index:

    python3 -m venv /tmp/tf && /tmp/tf/bin/pip install tensorflow-cpu==2.21.0 torch==2.13.0 'transformers<5'

The model is Google's BERT at toy sizes, its variables named and shaped as Google's ``modeling.py`` makes
them, saved by ``tf.compat.v1.train.Saver`` as Google saved theirs:

- ``checkpoints/pretrained/``: ``bert_config.json`` and ``bert_model.ckpt.{index,data-00000-of-00001}``, as
  the released ``uncased_L-12_H-768_A-12/`` holds them;
- ``checkpoints/classifier/``: what ``run_classifier.py`` leaves, two checkpoints (``model.ckpt-1`` and the
  latest, ``model.ckpt-2``, which the ``checkpoint`` file names) of the encoder and pooler (no pretraining
  heads) with its classifier (``output_weights``, ``output_bias``), Adam's moments of every variable and
  ``global_step``, beside the config copied in;
- ``checkpoints/expected.npz``: the inputs, and transformers' ``BertForPreTraining`` outputs in float64 from
  the pretrained checkpoint as ``load_tf_weights_in_bert`` loads it (encoder, MLM logits at the predicted
  positions, NSP logits).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "checkpoints"
CONFIG = {
    "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 8,
    "initializer_range": 0.02, "intermediate_size": 12, "max_position_embeddings": 16, "num_attention_heads": 2,
    "num_hidden_layers": 2, "type_vocab_size": 2, "vocab_size": 13,
}  # fmt: skip
LABELS = 3  # the classifier's


def variables() -> dict[str, tuple[int, ...]]:
    """Google's BERT's variables, named and shaped as its modeling.py creates them (kernels (in, out))."""
    H, F, V = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["vocab_size"]
    found = {
        "bert/embeddings/word_embeddings": (V, H),
        "bert/embeddings/token_type_embeddings": (CONFIG["type_vocab_size"], H),
        "bert/embeddings/position_embeddings": (CONFIG["max_position_embeddings"], H),
        "bert/embeddings/LayerNorm/beta": (H,),
        "bert/embeddings/LayerNorm/gamma": (H,),
    }
    for i in range(CONFIG["num_hidden_layers"]):
        layer = f"bert/encoder/layer_{i}"
        for dense, (n_in, n_out) in {
            "attention/self/query": (H, H), "attention/self/key": (H, H), "attention/self/value": (H, H),
            "attention/output/dense": (H, H), "intermediate/dense": (H, F), "output/dense": (F, H),
        }.items():  # fmt: skip
            found[f"{layer}/{dense}/kernel"], found[f"{layer}/{dense}/bias"] = (n_in, n_out), (n_out,)
        for norm in ("attention/output/LayerNorm", "output/LayerNorm"):
            found[f"{layer}/{norm}/beta"], found[f"{layer}/{norm}/gamma"] = (H,), (H,)
    found.update({
        "bert/pooler/dense/kernel": (H, H), "bert/pooler/dense/bias": (H,),
        "cls/predictions/transform/dense/kernel": (H, H), "cls/predictions/transform/dense/bias": (H,),
        "cls/predictions/transform/LayerNorm/beta": (H,), "cls/predictions/transform/LayerNorm/gamma": (H,),
        "cls/predictions/output_bias": (V,),
        "cls/seq_relationship/output_weights": (2, H), "cls/seq_relationship/output_bias": (2,),
    })  # fmt: skip
    return found


def save(directory: Path, arrays: dict[str, np.ndarray], steps: tuple[int, ...] = ()) -> None:
    """``arrays`` saved as TensorFlow variables of those names (at each of ``steps``, as a training run's
    model.ckpt-STEP, else as bert_model.ckpt)."""
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    with tf.Graph().as_default():
        made = {
            name: tf.compat.v1.get_variable(name, initializer=tf.constant(array), dtype=tf.as_dtype(array.dtype))
            for name, array in arrays.items()
        }
        saver = tf.compat.v1.train.Saver(made)
        # From inside the directory: the checkpoint file names its checkpoints by relative paths.
        with tf.compat.v1.Session() as session, contextlib.chdir(directory):
            session.run(tf.compat.v1.global_variables_initializer())
            for step in steps or (None,):
                saver.save(session, "bert_model.ckpt" if step is None else "model.ckpt", global_step=step,
                           write_meta_graph=False)  # fmt: skip


def expected(directory: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' outputs, in float64, of the checkpoint in ``directory`` as its TensorFlow loader reads it."""
    import torch
    import transformers
    from transformers.models.bert.modeling_bert import load_tf_weights_in_bert

    config = transformers.BertConfig.from_json_file(str(directory / "bert_config.json"))
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    model = transformers.BertForPreTraining(config)
    load_tf_weights_in_bert(model, config, str(directory / "bert_model.ckpt"))
    model = model.double().eval()
    tokens = torch.from_numpy(inputs["tokens"])
    mask = torch.arange(tokens.shape[1])[None, :] < torch.from_numpy(inputs["valid_lens"])[:, None]
    with torch.no_grad():
        out = model(
            input_ids=tokens, token_type_ids=torch.from_numpy(inputs["segments"]), attention_mask=mask.long(),
            output_hidden_states=True,
        )  # fmt: skip
    rows = np.arange(tokens.shape[0])[:, None]
    return {
        "encoded": out.hidden_states[-1].numpy(),
        "mlm": out.prediction_logits.numpy()[rows, inputs["pred_positions"]],
        "nsp": out.seq_relationship_logits.numpy(),
    }


def main() -> None:
    rng = np.random.default_rng(0)
    weights = {name: rng.normal(0, 0.5, shape).astype(np.float32) for name, shape in variables().items()}
    shutil.rmtree(OUT, ignore_errors=True)
    pretrained, classifier = OUT / "pretrained", OUT / "classifier"
    for directory in (pretrained, classifier):
        directory.mkdir(parents=True)
        (directory / "bert_config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    save(pretrained, weights)
    (pretrained / "checkpoint").unlink()  # TensorFlow's list of a run's checkpoints: Google's release has none
    head = {
        "output_weights": rng.normal(0, 0.5, (LABELS, CONFIG["hidden_size"])).astype(np.float32),
        "output_bias": np.zeros(LABELS, np.float32),
    }
    trained = {**{name: array for name, array in weights.items() if name.startswith("bert/")}, **head}
    slots = {f"{name}/{slot}": np.abs(rng.normal(0, 1e-3, array.shape)).astype(np.float32)
             for name, array in trained.items() for slot in ("adam_m", "adam_v")}  # fmt: skip
    save(classifier, {**trained, **slots, "global_step": np.array(2, np.int64)}, steps=(1, 2))
    inputs = {
        "tokens": rng.integers(0, CONFIG["vocab_size"], (3, 7)),
        "segments": np.array([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0, 0], [0] * 7]),
        "valid_lens": np.array([7, 5, 1]),  # a full row, a padded one, only <cls>
        "pred_positions": np.array([[1, 2], [0, 4], [0, 0]]),
    }
    arrays = {f"inputs/{name}": array for name, array in inputs.items()}
    arrays.update({f"outputs/{name}": array for name, array in expected(pretrained, inputs).items()})
    np.savez(OUT / "expected.npz", **arrays)
    for path in sorted(OUT.rglob("*")):
        if path.is_file():
            print(f"{path.relative_to(OUT)}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
