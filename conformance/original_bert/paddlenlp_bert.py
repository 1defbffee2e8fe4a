"""BERTs saved by PaddleNLP (PaddlePaddle's model library, whose ``bert-base-uncased`` and
``bert-base-chinese`` are Google's BERTs converted to it), and what PaddleNLP computes from them: the
fixtures of ``conformance/test_paddlenlp_checkpoints.py``, which only reads them.

    /tmp/paddlenlp/bin/python conformance/original_bert/paddlenlp_bert.py     write checkpoints/paddlenlp-*/
    /tmp/paddlenlp3/bin/python conformance/original_bert/paddlenlp_bert.py --paddlenlp3   then paddlenlp3-*/
    /tmp/paddlenlp2/bin/python conformance/original_bert/paddlenlp_bert.py --paddlenlp2   then paddlenlp2-*/
    .venv/bin/python conformance/original_bert/paddlenlp_bert.py --check PYTHON...   bert_multi's, loaded in each

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
- ``paddlenlp3-bfloat16/``: the model cast to bfloat16, then saved as safetensors;
- ``paddlenlp3-fused/``: a ``BertForPretraining`` built with ``fuse=True`` (Paddle's fused encoder layers,
  which compute on a GPU only: built, not run), as its ``save_pretrained`` writes it.

It then checks that what PaddleNLP 3 computes from ``paddlenlp3-safetensors/`` is what ``paddlenlp.npz``
holds, to the last bit in both dtypes (as it was for 3.0.0b4), so the tests hold these files to it too.

With ``--paddlenlp2``, in PaddleNLP 2.3 (2.0 to 2.4.2 saved ``model_config.json``: the arguments each model was
built with, a derived model's base ``BertModel`` among them, as ``init_args`` and keywords, those left out at
their defaults). PaddleNLP 2.3 imports ``paddle.fluid``, which Paddle 2.6 (the oldest for Python 3.11) has
no more, so only its BERT's modules are imported, with what they import but BERT never uses stubbed
(``paddlenlp2_transformers``):

    python3 -m venv /tmp/paddlenlp2 && /tmp/paddlenlp2/bin/pip install paddlepaddle==2.6.2 "numpy<2" six \
        && /tmp/paddlenlp2/bin/pip install --no-deps paddlenlp==2.3.7

- ``paddlenlp2-pretraining/``: a ``BertForPretraining`` of ``paddlenlp-pretraining/``'s weights, its
  ``BertModel`` built with keywords;
- ``paddlenlp2-classifier/``: a ``BertForSequenceClassification`` (3 classes), its ``BertModel`` of one block
  of four heads built with the first five arguments by position, ``hidden_act`` and the rest left out;
- ``paddlenlp2-model/``: a bare ``BertModel`` with ``type_vocab_size`` left at PaddleNLP 2's default, 16;
- ``paddlenlp2-cache/bert-toy/``: what ``from_pretrained`` of a model PaddleNLP 2 names (as its ``bert-base-uncased``)
  leaves in its download cache (``~/.paddlenlp/models/``): the weights under their URL's name,
  ``bert-toy.pdparams``, and ``model_config.json`` (``download_as_a_built_in_model``).

It checks that what PaddleNLP 2.3 computes from ``paddlenlp2-pretraining/`` is what ``paddlenlp.npz`` holds:
the same model under the old config, to the last bit in float64, and in float32 within two units in the last
place (2.3 adds the MLM decoder's bias after its product, 2.8 in it).

With ``--check`` (in a Python with bert_multi), ``bert-multi convert --framework paddlenlp`` writes PaddleNLP
directories of other libraries' files (``CHECKED``), and each PaddleNLP Python named loads them with its own
``from_pretrained``: every tensor by name (none left to initialize), and outputs the float64 oracle's on the
source, in float64 and float32.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
import zlib  # noqa: F401  # imported before Paddle, whose own zlib otherwise breaks what imports it later
from pathlib import Path

import numpy as np
from toy_bert import CONFIG, INPUTS, attention_mask

OUT = Path(__file__).resolve().parent / "checkpoints"
# What --check converts to PaddleNLP directories: (its name, the source in OUT, what bert-multi convert is told).
CHECKED = [
    ("from-paddlenlp-via-npz", "paddlenlp-pretraining", []),  # PaddleNLP's own, through the canonical file
    ("from-paddlenlp-model", "paddlenlp-model", []),  # a bare BertModel: the pooler its only head
    ("masked-lm", "paddlenlp-pretraining", []),  # its NSP head left out: a BertForMaskedLM
    ("from-google", "pretrained", []),  # Google's TensorFlow checkpoint
    ("from-transformers-tf", "tf-pretraining", []),  # transformers 4's TFBertForPreTraining
    ("from-pytorch-pretrained-bert", "pytorch-pretrained-bert", []),
    ("float64", "paddlenlp-pretraining", ["--cast", "float64"]),
]
SIZES = {**CONFIG, "type_vocab_size": 2, "hidden_act": "gelu"}


def paddlenlp_transformers():
    """PaddleNLP's ``transformers`` module, imported after what Paddle otherwise breaks when PaddleNLP imports
    it later (aiohttp's writer, pyarrow, scipy)."""
    import aiohttp._http_writer  # noqa: F401
    import pyarrow  # noqa: F401
    import scipy  # noqa: F401
    from paddlenlp import transformers

    return transformers


def randomized(model, rng: np.random.Generator):
    """``model`` with every parameter drawn from N(0, 0.5) (LayerNorms and biases too, so none is trivial)."""
    import paddle

    state = model.state_dict()
    model.set_state_dict({name: paddle.to_tensor(rng.normal(0, 0.5, value.shape).astype("float32"))
                          for name, value in state.items()})  # fmt: skip
    return model


def outputs(model, dtype: str) -> dict[str, np.ndarray]:
    """What a ``BertForPretraining`` (or a ``BertModel``: its encoding and pooled output) computes at ``INPUTS``
    in ``dtype``, dropout off."""
    import paddle

    model.to(dtype=dtype)
    model.eval()
    tensors = [paddle.to_tensor(INPUTS[name]) for name in ("tokens", "segments")]
    with paddle.no_grad():
        encoded, pooled = getattr(model, "bert", model)(tensors[0], token_type_ids=tensors[1],
                                                        attention_mask=paddle.to_tensor(attention_mask()))  # fmt: skip
        found = {"encoded": encoded.numpy(), "pooled": pooled.numpy()}
        if hasattr(model, "cls"):  # both heads (BertForPretraining), or the MLM head alone (BertForMaskedLM)
            both = hasattr(model.cls, "seq_relationship")
            scores, nsp = model.cls(encoded, pooled) if both else (model.cls(encoded), None)
            rows = np.arange(len(INPUTS["tokens"]))[:, None]
            found["mlm"] = scores.numpy()[rows, INPUTS["pred_positions"]]
            found.update({} if nsp is None else {"nsp": nsp.numpy()})
    return found


def main() -> None:
    transformers = paddlenlp_transformers()
    import paddle

    BertConfig, BertForPretraining, BertModel = (
        transformers.BertConfig,
        transformers.BertForPretraining,
        transformers.BertModel,
    )
    BertForSequenceClassification = transformers.BertForSequenceClassification

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
    BertForPretraining = paddlenlp_transformers().BertForPretraining
    import paddle

    model = BertForPretraining.from_pretrained(str(OUT / "paddlenlp-pretraining"))
    model.save_pretrained(str(OUT / "paddlenlp3-safetensors"), safe_serialization=True)
    model.save_pretrained(str(OUT / "paddlenlp3-shards"), safe_serialization=True, max_shard_size="2KB")
    model.save_pretrained(str(OUT / "paddlenlp3-pdparams-shards"), max_shard_size="2KB")
    model.to(dtype="bfloat16")
    model.save_pretrained(str(OUT / "paddlenlp3-bfloat16"), safe_serialization=True)
    paddle.seed(7)
    fused = BertForPretraining(paddlenlp_transformers().BertConfig(**SIZES, fuse=True))
    fused.save_pretrained(str(OUT / "paddlenlp3-fused"))
    with np.load(OUT / "paddlenlp.npz") as archive:
        for dtype in ("float64", "float32"):
            model = BertForPretraining.from_pretrained(str(OUT / "paddlenlp3-safetensors"))
            for name, value in outputs(model, dtype).items():
                if not np.array_equal(value, archive[f"{dtype}/{name}"]):
                    raise SystemExit(f"PaddleNLP 3 computes another {dtype} {name} than paddlenlp.npz holds")
    print(f"wrote {OUT}/paddlenlp3-*/; PaddleNLP 3 computes from them exactly what paddlenlp.npz holds")


def paddlenlp2_transformers():
    """PaddleNLP 2's BERT modules (``paddlenlp.transformers``, holding ``BertModel`` ...), imported without the
    package's ``__init__`` modules, which import the rest of PaddleNLP; what they import and BERT never uses
    (downloads, the logger's colours, text generation and its model parallelism) is stubbed."""
    import importlib.util
    import logging
    import types

    root = Path(importlib.util.find_spec("paddlenlp").submodule_search_locations[0])

    def stub(name, path=None, **attributes):
        module = types.ModuleType(name)
        module.__dict__.update(attributes, **({"__path__": [str(path)]} if path else {}))
        sys.modules[name] = module
        return module

    stub("paddlenlp", root)
    stub("paddlenlp.utils", root / "utils")
    stub(
        "paddlenlp.utils.downloader", get_path_from_url=None, download_check=lambda *_: None, COMMUNITY_MODEL_PREFIX=""
    )
    stub("paddlenlp.utils.env", MODEL_HOME=tempfile.mkdtemp())
    stub("paddlenlp.utils.log", logger=logging.getLogger("paddlenlp"))
    transformers = stub("paddlenlp.transformers", root / "transformers")
    stub("paddlenlp.transformers.generation_utils", GenerationMixin=type("GenerationMixin", (), {}))
    for name in ("ops", "ops.faster_transformer", "ops.faster_transformer.transformer"):
        stub(f"paddlenlp.{name}")
    unsharded = types.SimpleNamespace(fit_partial_model=lambda model, state: state)  # no model parallelism
    stub("paddlenlp.ops.faster_transformer.transformer.decoding", get_ft_para_conf=lambda: unsharded)
    from paddlenlp.transformers import model_utils

    transformers.PretrainedModel = model_utils.PretrainedModel
    transformers.register_base_model = model_utils.register_base_model
    from paddlenlp.transformers.bert import modeling

    return modeling


def download_as_a_built_in_model(modeling, name: str, weights: Path) -> None:
    """``BertForPretraining.from_pretrained(name)`` of a model PaddleNLP 2 names, as its built-in ``bert-base-uncased``
    ...: its arguments in ``pretrained_init_configuration``, its weights downloaded (here, copied from ``weights``)
    into ``MODEL_HOME/name/`` under their URL's name, and ``model_config.json`` written beside them."""
    import shutil

    from paddlenlp.transformers import model_utils

    url = f"https://bj.bcebos.com/paddlenlp/models/transformers/{name}.pdparams"
    modeling.BertPretrainedModel.pretrained_init_configuration[name] = {
        **{key: SIZES[key] for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")},
        **{"intermediate_size": SIZES["intermediate_size"], "hidden_act": "gelu", "hidden_dropout_prob": 0.1},
        **{"attention_probs_dropout_prob": 0.1, "max_position_embeddings": SIZES["max_position_embeddings"]},
        **{"type_vocab_size": 2, "initializer_range": 0.02, "pad_token_id": 0},
    }  # as bert-base-uncased's entry lists them
    modeling.BertPretrainedModel.pretrained_resource_files_map["model_state"][name] = url

    def download(url: str, root: str) -> str:
        Path(root).mkdir(parents=True, exist_ok=True)
        return str(shutil.copy(weights, Path(root) / url.split("/")[-1]))

    model_utils.get_path_from_url, model_utils.MODEL_HOME = download, str(OUT / "paddlenlp2-cache")
    modeling.BertForPretraining.from_pretrained(name)


def main_paddlenlp2() -> None:
    modeling = paddlenlp2_transformers()
    import paddle

    rng = np.random.default_rng(8)
    paddle.seed(8)
    built_with = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    keywords = {key: SIZES[key] for key in (*built_with, "max_position_embeddings", "type_vocab_size")}
    pretraining = modeling.BertForPretraining(modeling.BertModel(**keywords))
    saved = paddle.load(str(OUT / "paddlenlp-pretraining" / "model_state.pdparams"))
    saved["cls.predictions.decoder_weight"] = saved.pop("cls.predictions.decoder.weight")  # PaddleNLP 2.3's name
    del saved["cls.predictions.decoder.bias"]  # 2.8 saves the bias twice, 2.3 once (as decoder_bias)
    if sorted(saved) != sorted(pretraining.state_dict()):
        raise SystemExit("PaddleNLP 2.3's BertForPretraining has other tensors than 2.8's file")
    pretraining.set_state_dict(saved)
    pretraining.save_pretrained(str(OUT / "paddlenlp2-pretraining"))
    # One block of four heads, so that the arguments by position tell each other apart.
    positional = [SIZES["vocab_size"], SIZES["hidden_size"], 1, 4, SIZES["intermediate_size"]]
    bert = modeling.BertModel(*positional, max_position_embeddings=SIZES["max_position_embeddings"], type_vocab_size=2)
    randomized(modeling.BertForSequenceClassification(bert, num_classes=3), rng).save_pretrained(
        str(OUT / "paddlenlp2-classifier")
    )
    bare = {key: value for key, value in keywords.items() if key != "type_vocab_size"}
    randomized(modeling.BertModel(**bare), rng).save_pretrained(str(OUT / "paddlenlp2-model"))
    download_as_a_built_in_model(modeling, "bert-toy", OUT / "paddlenlp2-pretraining" / "model_state.pdparams")
    with np.load(OUT / "paddlenlp.npz") as archive:
        for dtype in ("float64", "float32"):
            model = modeling.BertForPretraining.from_pretrained(str(OUT / "paddlenlp2-pretraining"))
            for name, value in outputs(model, dtype).items():
                saved = archive[f"{dtype}/{name}"]
                # 2.3's MLM decoder adds its bias after the product, 2.8's in it: float32 rounds them apart.
                ulps = np.abs(value - saved) / np.spacing(np.abs(saved).astype(dtype))
                if ulps.max() > (0 if dtype == "float64" else 2):
                    raise SystemExit(f"PaddleNLP 2.3 computes another {dtype} {name} than paddlenlp.npz holds")
    print(f"wrote {OUT}/paddlenlp2-*/; PaddleNLP 2.3 computes from them what paddlenlp.npz holds (float64: exactly)")


def check(pythons: list[str]) -> None:
    """In bert_multi's Python: convert ``CHECKED`` to PaddleNLP directories, record the oracle's outputs on each
    source, and have each PaddleNLP Python load and run them (``check_child``)."""
    import bert_multi as bm

    bert_multi = Path(sys.executable).with_name("bert-multi")
    with tempfile.TemporaryDirectory() as scratch:
        for name, source, statements in CHECKED:
            path = OUT / source
            if name in ("from-paddlenlp-via-npz", "masked-lm"):  # through the canonical file
                original = bm.load_checkpoint(path)
                config, weights = original.config, original.weights
                if name == "masked-lm":
                    config = dataclasses.replace(config, heads=("pooler", "mlm"))
                    weights = {key: array for key, array in weights.items() if not key.startswith("nsp.")}
                path = Path(scratch) / f"{name}-source.npz"
                bm.save_weights(path, config, weights)
            subprocess.run([str(bert_multi), "convert", str(path), str(Path(scratch) / name), "--framework",
                            "paddlenlp", *statements], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
            checkpoint = bm.load_checkpoint(path)
            weights = {key: array.astype(np.float64) for key, array in checkpoint.weights.items()}
            out = bm.load_backend("numpy").build(checkpoint.config, weights, dtype="float64")(**INPUTS)
            pooled = np.tanh(out.encoded[:, 0] @ weights["hidden.0.weight"].T + weights["hidden.0.bias"])
            heads = {"mlm": out.mlm, "nsp": out.nsp}
            expected = {"encoded": out.encoded, "pooled": pooled, **{k: v for k, v in heads.items() if v is not None}}
            np.savez(Path(scratch) / f"{name}.npz", **expected)
        for python in pythons:
            subprocess.run([python, __file__, "--check-child", scratch], check=True)


def check_child(scratch: Path) -> None:
    """In a PaddleNLP Python: each directory loaded by from_pretrained, every tensor by name, and run."""
    transformers = paddlenlp_transformers()
    import paddle
    import paddlenlp

    print(f"PaddleNLP {paddlenlp.__version__} on Paddle {paddle.__version__}: bert_multi's PaddleNLP directories")
    for name, _, _ in CHECKED:
        directory = scratch / name
        architecture = json.loads((directory / "config.json").read_text())["architectures"][0]
        model = getattr(transformers, architecture).from_pretrained(str(directory))
        saved = paddle.load(str(directory / "model_state.pdparams"))
        state = model.state_dict()
        if sorted(state) != sorted(saved) or any(not np.array_equal(state[k].numpy(), saved[k]) for k in saved):
            raise SystemExit(f"{directory}: {architecture} did not load every tensor of the file by name")
        with np.load(scratch / f"{name}.npz") as archive:
            expected = dict(archive)
        errors = {}
        for dtype, bound in (("float64", 1e-12), ("float32", 1e-5)):
            found = outputs(getattr(transformers, architecture).from_pretrained(str(directory)), dtype)
            if sorted(found) != sorted(expected):
                raise SystemExit(f"{directory}: computes {sorted(found)}, the oracle {sorted(expected)}")
            errors[dtype] = max(float(np.abs(found[k] - expected[k]).max()) for k in expected)
            if errors[dtype] > bound:
                raise SystemExit(f"{directory}: {dtype} outputs differ from the oracle's by {errors[dtype]:.2e}")
        print(f"  {name}: {architecture}, {len(saved)} tensors loaded by name; largest difference from the oracle "
              f"{errors['float64']:.1e} in float64, {errors['float32']:.1e} in float32")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--check"]:
        check(sys.argv[2:])
    elif sys.argv[1:2] == ["--check-child"]:
        check_child(Path(sys.argv[2]))
    else:
        {"--paddlenlp3": main_paddlenlp3, "--paddlenlp2": main_paddlenlp2}.get("".join(sys.argv[1:2]), main)()
