"""BERTs saved by KerasHub (Keras 3's model library, once KerasNLP) as its presets, and what KerasHub
and transformers compute from them: the fixtures of ``conformance/test_keras_hub_checkpoints.py``, which only
reads them.

    python conformance/original_bert/keras_hub_bert.py     write checkpoints/keras-hub-*/ and keras-hub.npz

``save_to_preset`` writes a directory: ``config.json`` (the ``BertBackbone``'s arguments),
``model.weights.h5`` (Keras 3's HDF5 weights file), ``metadata.json``, and for a task (``BertMaskedLM``,
``BertTextClassifier``) its ``task.json`` and ``task.weights.h5`` beside them. None of the project's
environments holds KerasHub; a throw-away one does, with no network beyond the package index (KerasHub
pulls TensorFlow in for its tokenizers; the models run on Keras's PyTorch backend):

    python3 -m venv /tmp/kh && /tmp/kh/bin/pip install keras-hub==0.32.0 transformers==5.24.0 torch==2.13.0

Keras computes a LayerNorm in float32 whatever its model's dtype (its dtype promotion is JAX's without
x64), so no KerasHub model computes in float64. The float64 reference is transformers': a random
``BertModel`` of ``toy_bert.py``'s sizes, with GELU's tanh form (``gelu_pytorch_tanh``, as KerasHub's BERT
computes it), saved by transformers and converted to a ``BertBackbone`` by KerasHub's own converter
(``from_preset`` on a transformers directory), not bert_multi's. Written:

- ``keras-hub-backbone/``: that ``BertBackbone`` (two blocks), saved by ``save_to_preset``;
- ``keras-hub-masked-lm/``: a ``BertMaskedLM`` on a backbone of one block in float64, its weights drawn at
  random (Keras starts biases at zero and LayerNorms at one);
- ``keras-hub-masked-lm.keras``: that ``BertMaskedLM`` saved by ``model.save`` (a zip of its config, which holds
  the backbone's, and one ``model.weights.h5``, where the backbone is the layer ``bert_backbone`` beside the
  head and the optimizer's state);
- ``keras-hub-classifier/``: a ``BertTextClassifier`` (3 classes) on a backbone of one block, random too;
- ``keras-hub.npz``: the inputs; ``transformers/...``, the ``BertModel``'s encoding and pooled output in
  float64; ``keras/...``, the same of ``keras-hub-backbone/`` as KerasHub computes them (float32); and
  ``masked-lm/encoded``, the encoding of ``keras-hub-masked-lm/``'s backbone as KerasHub computes it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from toy_bert import CONFIG, INPUTS, attention_mask

os.environ.setdefault("KERAS_BACKEND", "torch")

OUT = Path(__file__).resolve().parent / "checkpoints"
# toy_bert's sizes under BertBackbone's argument names.
SIZES = {
    "vocabulary_size": CONFIG["vocab_size"],
    "hidden_dim": CONFIG["hidden_size"],
    "intermediate_dim": CONFIG["intermediate_size"],
    "num_heads": CONFIG["num_attention_heads"],
    "num_layers": CONFIG["num_hidden_layers"],
    "max_sequence_length": CONFIG["max_position_embeddings"],
}


def randomized(model, rng: np.random.Generator):
    """A Keras ``model`` with every weight drawn from N(0, 0.5)."""
    model.set_weights([rng.normal(0, 0.5, weight.shape).astype(weight.dtype) for weight in model.get_weights()])
    return model


def transformers_bert(directory: Path, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Save a random transformers ``BertModel`` computing GELU's tanh form to ``directory``; its float64
    encoding and pooled output at ``INPUTS``."""
    import torch
    import transformers

    config = transformers.BertConfig(**CONFIG, hidden_act="gelu_pytorch_tanh", attn_implementation="eager")
    model = transformers.BertModel(config).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.from_numpy(rng.normal(0, 0.5, parameter.shape)))
        model.float().save_pretrained(directory)
        out = model.double()(torch.from_numpy(INPUTS["tokens"]), attention_mask=torch.from_numpy(attention_mask()),
                             token_type_ids=torch.from_numpy(INPUTS["segments"]))  # fmt: skip
    return {"encoded": out.last_hidden_state.numpy(), "pooled": out.pooler_output.numpy()}


def inputs() -> dict[str, np.ndarray]:
    """``INPUTS`` as a KerasHub BERT takes them: token ids, segment ids and a padding mask."""
    return {"token_ids": INPUTS["tokens"], "segment_ids": INPUTS["segments"], "padding_mask": attention_mask()}


def keras_outputs(backbone) -> dict[str, np.ndarray]:
    """A ``BertBackbone``'s own encoding and pooled output at ``INPUTS``."""
    from keras import ops

    out = backbone(inputs())
    return {
        "encoded": ops.convert_to_numpy(out["sequence_output"]),
        "pooled": ops.convert_to_numpy(out["pooled_output"]),
    }


def main() -> None:
    import keras_hub

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as directory:
        arrays = {f"transformers/{name}": array for name, array in transformers_bert(Path(directory), rng).items()}
        backbone = keras_hub.models.BertBackbone.from_preset(directory)
    arrays.update({f"keras/{name}": array for name, array in keras_outputs(backbone).items()})
    one_block = {**SIZES, "num_layers": 1}
    masked_lm = keras_hub.models.BertMaskedLM(keras_hub.models.BertBackbone(**one_block, dtype="float64"))
    arrays["masked-lm/encoded"] = keras_outputs(randomized(masked_lm, rng).backbone)["encoded"]
    classifier = keras_hub.models.BertTextClassifier(keras_hub.models.BertBackbone(**one_block), num_classes=3)
    randomized(classifier, rng)
    arrays.update({f"inputs/{name}": array for name, array in INPUTS.items()})
    for case, model in {
        "keras-hub-backbone": backbone,
        "keras-hub-masked-lm": masked_lm,
        "keras-hub-classifier": classifier,
    }.items():
        shutil.rmtree(OUT / case, ignore_errors=True)
        model.save_to_preset(OUT / case)
        print(f"{case}: {sorted((path.name, path.stat().st_size) for path in (OUT / case).iterdir())}")
    masked_lm.save(OUT / "keras-hub-masked-lm.keras")  # model.save: one zip, the backbone a layer of the task
    print(f"keras-hub-masked-lm.keras: {(OUT / 'keras-hub-masked-lm.keras').stat().st_size} bytes")
    np.savez(OUT / "keras-hub.npz", **arrays)
    print(f"keras-hub.npz: {(OUT / 'keras-hub.npz').stat().st_size} bytes")


if __name__ == "__main__":
    main()
