"""BERTs saved by transformers' own Flax classes (``save_pretrained`` writes ``config.json`` and
``flax_model.msgpack``), and what transformers computes from them: the fixtures of
``conformance/test_old_huggingface_checkpoints.py``, which only reads them.

    python conformance/original_bert/hf_flax.py      write checkpoints/flax-*/ and checkpoints/flax.npz

transformers 5 dropped its Flax classes, so directories saved by them load in no transformers of today.
This needs a transformers of before 5.0 with JAX and Flax, which none of the project's environments
holds; a throw-away one does, with no network beyond the package index:

    python3 -m venv /tmp/hfflax && /tmp/hfflax/bin/pip install 'transformers<5' 'jax[cpu]' flax torch==2.13.0

The model is ``tf_checkpoints.py``'s toy BERT, every parameter drawn at random (LayerNorms' too, so that
a scale read as a bias shows). Written:

- ``flax-pretraining/``: a ``FlaxBertForPreTraining``, its MLM decoder tied to the word embeddings;
- ``flax-model/``: a ``FlaxBertModel`` (its tree has no ``bert`` level and no heads) of the same encoder;
- ``flax-classifier/``: a ``FlaxBertForSequenceClassification`` (3 labels) of the same encoder;
- ``flax-untied-bfloat16/``: a ``FlaxBertForPreTraining`` with its own decoder
  (``tie_word_embeddings=False``), its parameters cast to bfloat16 by ``to_bf16`` before saving;
- ``flax-safetensors/``: ``flax-pretraining/``'s model saved with ``safe_serialization=True``: a
  ``model.safetensors`` of the Flax tree's dotted names and (in, out) kernels, its metadata's format ``flax``;
- ``flax.npz``: the inputs, and two sets of outputs (encoding, MLM logits at the predicted positions, NSP
  logits): ``flax/...``, the Flax model's own in float32, and ``{case}/...``, the PyTorch model
  transformers builds from each directory with its ``load_flax_checkpoint_in_pytorch_model`` (what
  ``from_pretrained(from_flax=True)`` calls: its own name mapping, not bert_multi's), in float64.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from toy_bert import CONFIG, INPUTS, attention_mask, pytorch_outputs

OUT = Path(__file__).resolve().parent / "checkpoints"


def randomized(params: dict, rng: np.random.Generator) -> dict:
    """``params`` with every leaf drawn from N(0, 0.5), as float32 JAX arrays (``to_bf16`` casts no other)."""
    import jax

    return jax.tree_util.tree_map(lambda leaf: jax.numpy.asarray(rng.normal(0, 0.5, leaf.shape), "float32"), params)


def flax_outputs(model) -> dict[str, np.ndarray]:
    """The Flax ``FlaxBertForPreTraining``'s own outputs, float32, at ``INPUTS``."""
    tokens = INPUTS["tokens"]
    out = model(tokens, attention_mask=attention_mask(), token_type_ids=INPUTS["segments"], output_hidden_states=True)
    rows = np.arange(tokens.shape[0])[:, None]
    return {
        "encoded": np.asarray(out.hidden_states[-1]),
        "mlm": np.asarray(out.prediction_logits)[rows, INPUTS["pred_positions"]],
        "nsp": np.asarray(out.seq_relationship_logits),
    }


def torch_outputs(directory: Path, heads: bool) -> dict[str, np.ndarray]:
    """What transformers' PyTorch BERT computes in float64 from the Flax directory, by its own conversion."""
    import transformers
    from transformers.modeling_flax_pytorch_utils import load_flax_checkpoint_in_pytorch_model

    cls = transformers.BertForPreTraining if heads else transformers.BertModel
    model = cls(transformers.BertConfig.from_pretrained(directory, attn_implementation="eager"))
    return pytorch_outputs(load_flax_checkpoint_in_pytorch_model(model, str(directory / "flax_model.msgpack")))


def main() -> None:
    import transformers

    rng = np.random.default_rng(0)
    config = transformers.BertConfig(**CONFIG)
    pretraining = transformers.FlaxBertForPreTraining(config, seed=0)
    pretraining.params = randomized(pretraining.params, rng)
    encoder = pretraining.params["bert"]
    classifier = transformers.FlaxBertForSequenceClassification(transformers.BertConfig(**CONFIG, num_labels=3))
    classifier.params = {"bert": encoder, "classifier": randomized(classifier.params["classifier"], rng)}
    untied = transformers.FlaxBertForPreTraining(transformers.BertConfig(**CONFIG, tie_word_embeddings=False))
    untied.params = untied.to_bf16(randomized(untied.params, rng))
    models = {
        "flax-pretraining": (pretraining, pretraining.params),
        "flax-model": (transformers.FlaxBertModel(config), encoder),
        "flax-classifier": (classifier, classifier.params),
        "flax-untied-bfloat16": (untied, untied.params),
        "flax-safetensors": (pretraining, pretraining.params),
    }
    arrays = {f"inputs/{name}": array for name, array in INPUTS.items()}
    arrays.update({f"flax/{name}": array for name, array in flax_outputs(pretraining).items()})
    for case, (model, params) in models.items():
        shutil.rmtree(OUT / case, ignore_errors=True)
        model.save_pretrained(OUT / case, params=params, safe_serialization=case == "flax-safetensors")
        if case not in ("flax-classifier", "flax-safetensors"):  # their encoder and model are flax-pretraining's
            found = torch_outputs(OUT / case, heads=case != "flax-model")
            arrays.update({f"{case}/{name}": array for name, array in found.items()})
        written = json.loads((OUT / case / "config.json").read_text())
        print(
            f"{case}: {written['architectures']}, {sorted((p.name, p.stat().st_size) for p in (OUT / case).iterdir())}"
        )
    np.savez(OUT / "flax.npz", **arrays)
    print(f"flax.npz: {(OUT / 'flax.npz').stat().st_size} bytes")


if __name__ == "__main__":
    main()
