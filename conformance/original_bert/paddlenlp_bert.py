"""BERTs saved by PaddleNLP (PaddlePaddle's model library, whose ``bert-base-uncased`` and
``bert-base-chinese`` are Google's BERTs converted to it), and what PaddleNLP computes from them: the
fixtures of ``conformance/test_paddlenlp_checkpoints.py``, which only reads them.

    /tmp/paddlenlp/bin/python conformance/original_bert/paddlenlp_bert.py     write checkpoints/paddlenlp-*/
    /tmp/paddlenlp3/bin/python conformance/original_bert/paddlenlp_bert.py --paddlenlp3   then paddlenlp3-*/

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

With ``--paddlenlp3``, in PaddleNLP 3 (whose ``save_pretrained(safe_serialization=True)`` writes
safetensors: its own names and layouts, bfloat16 as uint16 bits), which loads ``paddlenlp-pretraining/``
and saves it again, as a user upgrading does:

    python3 -m venv /tmp/paddlenlp3 && /tmp/paddlenlp3/bin/pip install paddlepaddle==3.3.1 paddlenlp==3.0.0b4 \\
        aistudio-sdk==0.2.1 "datasets<3" "pyarrow<18" "huggingface_hub<0.26"

- ``paddlenlp3-safetensors/``: ``model.safetensors``;
- ``paddlenlp3-shards/``: the same in shards of at most 2 KB, beside ``model.safetensors.index.json``;
- ``paddlenlp3-pdparams-shards/``: ``model_state.pdparams`` in such shards, beside its index;
- ``paddlenlp3-bfloat16/``: the model cast to bfloat16, then saved as safetensors.

It then checks that what PaddleNLP 3 computes from ``paddlenlp3-safetensors/`` is what ``paddlenlp.npz``
holds, to the last bit in both dtypes (as it was for 3.0.0b4), so the tests hold these files to it too.
"""

from __future__ import annotations

import sys
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


def main_paddlenlp3() -> None:
    from paddlenlp.transformers import BertForPretraining

    model = BertForPretraining.from_pretrained(str(OUT / "paddlenlp-pretraining"))
    model.save_pretrained(str(OUT / "paddlenlp3-safetensors"), safe_serialization=True)
    model.save_pretrained(str(OUT / "paddlenlp3-shards"), safe_serialization=True, max_shard_size="2KB")
    model.save_pretrained(str(OUT / "paddlenlp3-pdparams-shards"), max_shard_size="2KB")
    model.to(dtype="bfloat16")
    model.save_pretrained(str(OUT / "paddlenlp3-bfloat16"), safe_serialization=True)
    with np.load(OUT / "paddlenlp.npz") as archive:
        for dtype in ("float64", "float32"):
            model = BertForPretraining.from_pretrained(str(OUT / "paddlenlp3-safetensors"))
            for name, value in outputs(model, dtype).items():
                if not np.array_equal(value, archive[f"{dtype}/{name}"]):
                    raise SystemExit(f"PaddleNLP 3 computes another {dtype} {name} than paddlenlp.npz holds")
    print(f"wrote {OUT}/paddlenlp3-*/; PaddleNLP 3 computes from them exactly what paddlenlp.npz holds")


if __name__ == "__main__":
    main_paddlenlp3() if sys.argv[1:] == ["--paddlenlp3"] else main()
