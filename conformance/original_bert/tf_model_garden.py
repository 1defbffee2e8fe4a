"""BERTs saved by TensorFlow 2 from the TF Model Garden's ``BertEncoder`` (``official.nlp.modeling.networks``,
whose exports are TF Hub's BERTs), and what TensorFlow computes from them: the fixtures of
``conformance/test_tf_model_garden_checkpoints.py``, which only reads them.

    python conformance/original_bert/tf_model_garden.py     write checkpoints/tf2-*/ and tf2.npz

TensorFlow 2 saves objects, not names: each variable under its place in the object graph
(``layer_with_weights-0/embeddings/.ATTRIBUTES/VARIABLE_VALUE``), the graph itself a string tensor of the
checkpoint that gives each variable's own name (``word_embeddings/embeddings``). None of the project's
environments holds TensorFlow; a throw-away one does, with no network beyond the package index:

    python3 -m venv /tmp/tfm && /tmp/tfm/bin/pip install --no-deps tf-models-official==2.20.0 && \
        /tmp/tfm/bin/pip install tensorflow-cpu==2.20.0 tf-keras==2.20.1 tensorflow-text==2.20.* gin-config \
        pyyaml scipy tf_slim

The model is ``toy_bert.py``'s sizes, every weight drawn at random. Written:

- ``tf2-savedmodel/variables/``: ``tf.saved_model.save`` of the encoder; its ``saved_model.pb`` (the graph,
  534 KB, which bert_multi does not read) and ``fingerprint.pb`` are removed to keep the fixture small;
- ``tf2-training/``: ``tf.train.Checkpoint(model=..., optimizer=...).save`` after one Adam step
  (``ckpt-1.index`` and its data, Adam's moments beside the weights);
- ``tf2-pretrainer/``: a ``BertPretrainerV2`` (its encoder of one block, and its MLM head, whose activation
  is the constructor's ``mlm_activation``: none here, its default), saved as a checkpoint;
- ``tf2-classifier/``: a ``BertClassifier`` (3 classes; its encoder of one block) after one Adam step, its head
  (``sentence_prediction/logits``) and Adam's moments of it beside the encoder's;
- ``tf2.npz``: the inputs; ``float32/...``, the encoder's own outputs (``sequence_output`` and
  ``pooled_output``) on the SavedModel's weights, ``trained/...`` on the training checkpoint's, and
  ``pretrainer/...`` and ``classifier/...``, those of the pretrainer's and the classifier's encoders. The
  Model Garden computes its LayerNorms in float32 whatever the model's dtype (``dtype=tf.float32`` in its
  layers), so TensorFlow gives no float64 outputs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
from toy_bert import CONFIG, INPUTS, attention_mask

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # the Model Garden's layers are Keras 2's

OUT = Path(__file__).resolve().parent / "checkpoints"


def encoder(num_layers: int = CONFIG["num_hidden_layers"]):
    """The Model Garden's BertEncoder of ``toy_bert``'s sizes (its defaults: GELU's tanh form, eps 1e-12)."""
    from official.nlp.modeling import networks

    built = networks.BertEncoder(
        vocab_size=CONFIG["vocab_size"], hidden_size=CONFIG["hidden_size"], inner_dim=CONFIG["intermediate_size"],
        num_attention_heads=CONFIG["num_attention_heads"], num_layers=num_layers,
        max_sequence_length=CONFIG["max_position_embeddings"], type_vocab_size=2, dict_outputs=True,
    )  # fmt: skip
    built(inputs())
    return built


def inputs() -> dict:
    import tensorflow as tf

    return {
        "input_word_ids": tf.constant(INPUTS["tokens"], tf.int32),
        "input_mask": tf.constant(attention_mask(), tf.int32),
        "input_type_ids": tf.constant(INPUTS["segments"], tf.int32),
    }


def outputs(model) -> dict[str, np.ndarray]:
    out = model(inputs())
    return {"encoded": out["sequence_output"].numpy(), "pooled": out["pooled_output"].numpy()}


def main() -> None:
    import tensorflow as tf
    from official.nlp.modeling import models

    rng = np.random.default_rng(0)
    model = encoder()
    model.set_weights([rng.normal(0, 0.5, w.shape).astype(np.float32) for w in model.get_weights()])
    arrays = {f"inputs/{name}": array for name, array in INPUTS.items()}
    arrays.update({f"float32/{name}": array for name, array in outputs(model).items()})

    saved = OUT / "tf2-savedmodel"
    shutil.rmtree(saved, ignore_errors=True)
    tf.saved_model.save(model, str(saved))
    for left in ("saved_model.pb", "fingerprint.pb", "assets"):
        shutil.rmtree(saved / left) if (saved / left).is_dir() else (saved / left).unlink(missing_ok=True)
    training = OUT / "tf2-training"
    shutil.rmtree(training, ignore_errors=True)
    optimizer = tf.keras.optimizers.Adam()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(inputs())["sequence_output"])
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    arrays.update({f"trained/{name}": array for name, array in outputs(model).items()})
    tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(training / "ckpt"))
    pretrainer = OUT / "tf2-pretrainer"
    shutil.rmtree(pretrainer, ignore_errors=True)
    with_head = models.BertPretrainerV2(encoder_network=encoder(num_layers=1), classification_heads=[])
    with_head({**inputs(), "masked_lm_positions": tf.constant(INPUTS["pred_positions"], tf.int32)})
    with_head.set_weights([rng.normal(0, 0.5, w.shape).astype(np.float32) for w in with_head.get_weights()])
    arrays.update({f"pretrainer/{name}": array for name, array in outputs(with_head.encoder_network).items()})
    tf.train.Checkpoint(model=with_head).save(str(pretrainer / "ckpt"))
    classifier = OUT / "tf2-classifier"
    shutil.rmtree(classifier, ignore_errors=True)
    network = encoder(num_layers=1)
    fine_tuned = models.BertClassifier(network, num_classes=3)
    fine_tuned(inputs())
    fine_tuned.set_weights([rng.normal(0, 0.5, w.shape).astype(np.float32) for w in fine_tuned.get_weights()])
    optimizer = tf.keras.optimizers.Adam()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(fine_tuned(inputs()))
    optimizer.apply_gradients(zip(tape.gradient(loss, fine_tuned.trainable_variables), fine_tuned.trainable_variables))
    arrays.update({f"classifier/{name}": array for name, array in outputs(network).items()})
    tf.train.Checkpoint(model=fine_tuned, optimizer=optimizer).save(str(classifier / "ckpt"))
    for case in (saved / "variables", training, pretrainer, classifier):
        print(f"{case.name}: {sorted((path.name, path.stat().st_size) for path in case.iterdir())}")
    np.savez(OUT / "tf2.npz", **arrays)
    print(f"tf2.npz: {(OUT / 'tf2.npz').stat().st_size} bytes")


if __name__ == "__main__":
    main()
