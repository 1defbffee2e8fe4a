"""BERTs saved by PaddleNLP (PaddlePaddle's model library, whose ``bert-base-uncased`` and
``bert-base-chinese`` are Google's BERTs converted to it), and what PaddleNLP computes from them: the
fixtures of ``conformance/test_paddlenlp_checkpoints.py``, which only reads them.

    /tmp/paddlenlp/bin/python conformance/original_bert/paddlenlp_bert.py     write checkpoints/paddlenlp-*/

``save_pretrained`` writes a directory: ``config.json`` (the ``BertConfig``) and ``model_state.pdparams``
(``paddle.save`` of the state_dict). None of the project's environments holds Paddle; a throw-away one
does, PaddleNLP 2.8 being the last for Paddle 2.6 (its dependencies pinned to what it was released with):

    python3 -m venv /tmp/paddlenlp && /tmp/paddlenlp/bin/pip install paddlepaddle==2.6.2 paddlenlp==2.8.1 \\
        "numpy<2" "huggingface_hub<0.26" aistudio-sdk==0.2.1 "datasets<3" "pyarrow<18" scipy==1.13.1

Written, each model of ``toy_bert.py``'s sizes with every weight drawn from N(0, 0.5), stored in float32:

- ``paddlenlp-pretraining/``: a ``BertForPretraining`` (encoder, pooler, MLM and NSP heads);
- ``paddlenlp-classifier/``: a ``BertForSequenceClassification`` (3 classes) on another such encoder;
- ``paddlenlp-model/``: a bare ``BertModel`` (its names without the ``bert.`` prefix);
- ``paddlenlp.npz``: the inputs; ``float64/...`` and ``float32/...``, what PaddleNLP computes from
  ``paddlenlp-pretraining/`` in each dtype: the encoding, the pooled output, the MLM logits at the predicted
  positions and the NSP logits.
"""

from __future__ import annotations

import zlib  # noqa: F401  # imported before Paddle, whose own zlib otherwise breaks what imports it later
from pathlib import Path

import aiohttp._http_writer  # noqa: F401  # the same: PaddleNLP imports them after Paddle
import numpy as np
import pyarrow  # noqa: F401
import scipy  # noqa: F401
from toy_bert import CONFIG, INPUTS, attention_mask

OUT = Path(__file__).resolve().parent / "checkpoints"
SIZES = {**CONFIG, "type_vocab_size": 2, "hidden_act": "gelu"}


def randomized(model, rng: np.random.Generator):
    """``model`` with every parameter drawn from N(0, 0.5) (LayerNorms and biases too, so none is trivial)."""
    import paddle

    state = model.state_dict()
    model.set_state_dict({name: paddle.to_tensor(rng.normal(0, 0.5, value.shape).astype("float32"))
                          for name, value in state.items()})  # fmt: skip
    return model


def outputs(model, dtype: str) -> dict[str, np.ndarray]:
    """What a ``BertForPretraining`` computes at ``INPUTS`` in ``dtype``, dropout off."""
    import paddle

    model.to(dtype=dtype)
    model.eval()
    tensors = [paddle.to_tensor(INPUTS[name]) for name in ("tokens", "segments")]
    with paddle.no_grad():
        encoded, pooled = model.bert(tensors[0], token_type_ids=tensors[1],
                                     attention_mask=paddle.to_tensor(attention_mask()))  # fmt: skip
        scores, nsp = model.cls(encoded, pooled)
    rows = np.arange(len(INPUTS["tokens"]))[:, None]
    return {
        "encoded": encoded.numpy(),
        "pooled": pooled.numpy(),
        "mlm": scores.numpy()[rows, INPUTS["pred_positions"]],
        "nsp": nsp.numpy(),
    }


def main() -> None:
    import paddle
    from paddlenlp.transformers import BertConfig, BertForPretraining, BertForSequenceClassification, BertModel

    rng = np.random.default_rng(7)
    paddle.seed(7)
    config = BertConfig(**SIZES)
    pretraining = randomized(BertForPretraining(config), rng)
    pretraining.save_pretrained(str(OUT / "paddlenlp-pretraining"))
    randomized(BertForSequenceClassification(BertConfig(**SIZES, num_labels=3)), rng).save_pretrained(
        str(OUT / "paddlenlp-classifier")
    )
    randomized(BertModel(config), rng).save_pretrained(str(OUT / "paddlenlp-model"))
    arrays = {f"inputs/{name}": array for name, array in INPUTS.items()}
    for dtype in ("float64", "float32"):  # float64 first: the saved weights, exactly, in float64
        model = BertForPretraining.from_pretrained(str(OUT / "paddlenlp-pretraining"))
        arrays.update({f"{dtype}/{name}": value for name, value in outputs(model, dtype).items()})
    np.savez_compressed(OUT / "paddlenlp.npz", **arrays)
    print(f"wrote {OUT}/paddlenlp-*/ and paddlenlp.npz")


if __name__ == "__main__":
    main()
