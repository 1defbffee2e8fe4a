"""A BERT saved as pytorch-pretrained-bert (transformers' first name, 2018) saved one, and what that
package computes with it: the fixtures of ``conformance/test_old_huggingface_checkpoints.py``, which only
reads them.

    .venv/bin/python conformance/original_bert/pytorch_pretrained_bert.py     write checkpoints/pytorch-pretrained-bert*

Like the d2l fixtures' generators, it fetches the release (0.3.0, of December 2018) with ``pip download``
into a throw-away directory and imports it from there, in the project's MXNet environment (its PyTorch),
with what it imports to download files (boto3, requests) stubbed. Its directories held ``bert_config.json``
(not yet ``config.json``) beside ``pytorch_model.bin``, a state_dict in torch.save's format of the time
(the legacy one, before PyTorch 1.6), its LayerNorms' parameters named ``gamma`` and ``beta``. Written:

- ``checkpoints/pytorch-pretrained-bert/``: ``bert_config.json`` and ``pytorch_model.bin`` of its
  ``BertForPreTraining`` at the toy sizes of ``tf_checkpoints.py``, every parameter drawn at random;
- ``checkpoints/pytorch-pretrained-bert.npz``: the inputs, and its outputs in float64 (the encoding, the
  MLM logits at the predicted positions, the NSP logits).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

import numpy as np
from toy_bert import CONFIG, INPUTS, attention_mask

OUT = Path(__file__).resolve().parent / "checkpoints"
RELEASE = "pytorch-pretrained-bert==0.3.0"


def import_release(directory: Path) -> types.ModuleType:
    """The release, fetched into ``directory`` and imported, what it downloads files with stubbed."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(directory), RELEASE], check=True)
    wheel = next(directory.glob("pytorch_pretrained_bert-*.whl"))
    zipfile.ZipFile(wheel).extractall(directory / "src")
    for name in ("boto3", "requests", "botocore", "botocore.exceptions"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["botocore.exceptions"].ClientError = Exception  # type: ignore[attr-defined]
    sys.path.insert(0, str(directory / "src"))
    import pytorch_pretrained_bert

    return pytorch_pretrained_bert


def main() -> None:
    import torch

    with tempfile.TemporaryDirectory() as scratch:
        package = import_release(Path(scratch))
        sizes = {name: value for name, value in CONFIG.items() if name != "vocab_size"}
        config = package.BertConfig(vocab_size_or_config_json_file=CONFIG["vocab_size"], **sizes)
        model = package.BertForPreTraining(config)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
        directory = OUT / "pytorch-pretrained-bert"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "bert_config.json").write_text(config.to_json_string())
        # The legacy format keys each storage by its address in memory: the bytes differ from run to run.
        torch.save(model.state_dict(), directory / "pytorch_model.bin", _use_new_zipfile_serialization=False)
        model = model.double().eval()
        tokens = torch.from_numpy(INPUTS["tokens"])
        mask = torch.from_numpy(attention_mask())
        segments = torch.from_numpy(INPUTS["segments"])
        with torch.no_grad():
            encoded, _ = model.bert(tokens, segments, mask, output_all_encoded_layers=False)
            mlm, nsp = model(tokens, segments, mask)
        rows = np.arange(tokens.shape[0])[:, None]
        outputs = {"encoded": encoded.numpy(), "mlm": mlm.numpy()[rows, INPUTS["pred_positions"]], "nsp": nsp.numpy()}
    arrays = {f"inputs/{name}": array for name, array in INPUTS.items()}
    arrays.update({f"outputs/{name}": array for name, array in outputs.items()})
    np.savez(OUT / "pytorch-pretrained-bert.npz", **arrays)
    for path in sorted([*directory.iterdir(), OUT / "pytorch-pretrained-bert.npz"]):
        print(f"{path.relative_to(OUT)}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
