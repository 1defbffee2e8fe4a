"""A BERT fine-tuned with PEFT's LoRA, saved as PEFT saves it: the fixtures of
``conformance/test_peft_checkpoints.py``, which only reads them.

    .venv/bin/python conformance/original_bert/peft_lora.py     write checkpoints/peft-*

transformers' ``BertForSequenceClassification`` at the toy sizes of ``toy_bert.py``, wrapped by
``peft.get_peft_model`` with LoRA (rank 2) on every block's query and value, trained ``STEPS`` Adam steps on
random batches. Saved:

- ``checkpoints/peft-adapter/``: the adapter, as ``PeftModel.save_pretrained`` writes it
  (``adapter_config.json``, ``adapter_model.safetensors``; its README.md left out);
- ``checkpoints/peft-model.safetensors``: the PEFT model's whole state_dict (each adapted layer's
  ``base_layer`` beside its ``lora_A`` and ``lora_B``), as ``save_file`` writes it.

bert_multi reads neither: it names the adapter with PEFT's call that merges it into its base model and
saves the whole. This script runs that call, from bert_multi's own message, with the base model saved
before training, and checks that what it saves computes, read by bert_multi, what the PEFT model computed.

PEFT and accelerate are installed with ``--no-deps`` into a throw-away directory; the rest is this
environment's (torch, transformers, safetensors).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "checkpoints"
PEFT = ("peft==0.21.2", "accelerate==1.15.0")
STEPS = 2


def main() -> None:
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parents[1]))
    import torch
    import transformers
    from safetensors.torch import save_file
    from toy_bert import CONFIG, INPUTS, attention_mask

    import bert_multi as bm
    from bert_multi.backend.registry import load_backend

    with tempfile.TemporaryDirectory() as directory:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", directory, *PEFT],
                       check=True)  # fmt: skip
        sys.path.insert(0, directory)
        import peft

        torch.manual_seed(0)
        base = transformers.BertForSequenceClassification(transformers.BertConfig(**CONFIG))
        base.save_pretrained(Path(directory) / "base")
        model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["query", "value"], task_type="SEQ_CLS"))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        generator = torch.Generator().manual_seed(0)
        for _ in range(STEPS):
            tokens = torch.randint(0, CONFIG["vocab_size"], (4, 7), generator=generator)
            loss = model(tokens, labels=torch.randint(0, 2, (4,), generator=generator)).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        shutil.rmtree(OUT / "peft-adapter", ignore_errors=True)
        model.save_pretrained(OUT / "peft-adapter")
        (OUT / "peft-adapter" / "README.md").unlink()
        save_file({name: tensor.detach().clone() for name, tensor in model.state_dict().items()},
                  str(OUT / "peft-model.safetensors"))  # fmt: skip
        model = model.double().eval()
        with torch.no_grad():
            out = model(torch.from_numpy(INPUTS["tokens"]), attention_mask=torch.from_numpy(attention_mask()),
                        token_type_ids=torch.from_numpy(INPUTS["segments"]), output_hidden_states=True)  # fmt: skip
        try:
            bm.load_checkpoint(OUT / "peft-adapter")
        except bm.WeightsError as refusal:
            call = str(refusal).split("which bert_multi reads: ", 1)[1].split(", base being", 1)[0]
        else:
            raise AssertionError("an adapter was read")
        base = transformers.BertForSequenceClassification.from_pretrained(Path(directory) / "base")
        with tempfile.TemporaryDirectory() as scratch:
            exec(call.replace("'merged'", repr(str(Path(scratch) / "merged"))), {"peft": peft, "base": base})
            checkpoint = bm.load_checkpoint(Path(scratch) / "merged")
        inputs = {name: INPUTS[name] for name in ("tokens", "segments", "valid_lens")}
        encoded = load_backend("numpy").build(checkpoint.config, checkpoint.weights)(**inputs).encoded
        assert np.allclose(encoded, out.hidden_states[-1].numpy(), rtol=0, atol=1e-6), "the merged model differs"
    for path in sorted(OUT.glob("peft-*")):
        for file in [path] if path.is_file() else sorted(path.iterdir()):
            print(f"{file.relative_to(OUT)}: {file.stat().st_size} bytes")


if __name__ == "__main__":
    main()
