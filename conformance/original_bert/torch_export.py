"""A BERT exported with ``torch.export`` and saved as its archive, and what the exported program computes: the
fixtures of ``conformance/test_exported_programs.py``, which only reads them.

    .venv/bin/python conformance/original_bert/torch_export.py     write checkpoints/exported*

- ``checkpoints/exported.pt2``: transformers' ``BertForPreTraining`` at the toy sizes of ``toy_bert.py`` but
  with one layer (the traced graph, most of the archive's bytes, grows by 100 KB a layer), in float64,
  exported with its attention mask and segments as a user deploying it exports it, and saved by
  ``torch.export.save`` (its decoder tied to the word embeddings: one storage under two names);
- ``checkpoints/exported.npz``: the inputs of ``toy_bert.py``, and what the exported program itself (``.module()``
  of what ``torch.export.load`` reads back) computes on them: the encoding, the MLM logits at the predicted
  positions and the NSP logits.

It runs in the project's main environment (torch and transformers are there); the fixture records their
versions beside the outputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "checkpoints"
sys.path.insert(0, str(HERE))

from toy_bert import CONFIG, INPUTS, attention_mask  # noqa: E402


def main() -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(**{**CONFIG, "num_hidden_layers": 1})
    model = transformers.BertForPreTraining(config).double().eval()
    tokens, segments = torch.from_numpy(INPUTS["tokens"]), torch.from_numpy(INPUTS["segments"])
    mask = torch.from_numpy(attention_mask())
    inputs = {"attention_mask": mask, "token_type_ids": segments, "output_hidden_states": True}
    torch.export.save(torch.export.export(model, (tokens,), inputs), OUT / "exported.pt2")
    with torch.no_grad():
        out = torch.export.load(OUT / "exported.pt2").module()(tokens, **inputs)
    rows = np.arange(len(tokens))[:, None]
    outputs = {
        "encoded": out.hidden_states[-1].numpy(),
        "mlm": out.prediction_logits.numpy()[rows, INPUTS["pred_positions"]],
        "nsp": out.seq_relationship_logits.numpy(),
    }
    np.savez(
        OUT / "exported.npz",
        **{f"inputs/{name}": array for name, array in INPUTS.items()},
        **{f"exported/{name}": array for name, array in outputs.items()},
        versions=np.array(f"torch {torch.__version__}, transformers {transformers.__version__}"),
    )


if __name__ == "__main__":
    main()
