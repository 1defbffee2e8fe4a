"""BERTs trained with PyTorch Lightning and saved as its checkpoints, and what each computes after training:
the fixtures of ``conformance/test_lightning_checkpoints.py``, which only reads them.

    .venv/bin/python conformance/original_bert/lightning_bert.py     write checkpoints/lightning-*

A Lightning checkpoint (``Trainer.save_checkpoint``, or its ``ModelCheckpoint`` callback) is a
``torch.save`` dict: the ``LightningModule``'s state_dict under ``'state_dict'``, every name under the
attribute that holds the model, beside the optimizer's state, the loops' counters and the
hyperparameters. Two modules, written as their users write them, each trained two Adam steps on random
batches with the Trainer on the CPU:

- ``checkpoints/lightning-transformers.ckpt``: transformers' ``BertForPreTraining`` at the toy sizes of
  ``toy_bert.py``, held as ``self.model`` (names ``model.bert.embeddings...``);
- ``checkpoints/lightning-d2l.ckpt``: d2l 1.0.3's own ``BERTModel`` at the same sizes, held as
  ``self.net``, its loss (``nn.CrossEntropyLoss``, as the chapter's) as ``self.loss``;
- ``checkpoints/lightning.npz``: the inputs of ``toy_bert.py``, and each trained model's outputs on them in
  float64 (the encoding, the MLM logits at the predicted positions, the NSP logits).

Like the d2l fixtures' generators, it installs ``d2l==1.0.3`` with ``--no-deps`` into a throw-away
directory and runs itself as a child in which that d2l is importable (what d2l imports and BERT never uses
stubbed); the child installs ``lightning==2.6.6`` with the two packages of its own it needs the same way.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "checkpoints"
LIGHTNING = ("lightning==2.6.6", "lightning-utilities==0.15.3", "torchmetrics==1.9.0")
STEPS = 2


def import_lightning(directory: str):
    """Lightning, installed into ``directory`` (its other dependencies are the project's environment's)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", directory,
                    *LIGHTNING], check=True)  # fmt: skip
    sys.path.insert(0, directory)
    import lightning

    return lightning


def train(lightning, module, batches: list) -> None:
    """``STEPS`` steps of ``module`` with Lightning's Trainer on the CPU, as a user's script runs them."""
    import torch

    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    trainer = lightning.Trainer(
        max_steps=STEPS, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tempfile.gettempdir(),
    )  # fmt: skip
    trainer.fit(module, loader)
    trainer.save_checkpoint(OUT / f"lightning-{module.kind}.ckpt")


def child() -> None:
    import torch

    sys.path.insert(0, str(HERE))
    from toy_bert import CONFIG, INPUTS, pytorch_outputs

    with tempfile.TemporaryDirectory() as directory:
        lightning = import_lightning(directory)
        # After Lightning, which looks for some of the packages stubbed (torchvision, pandas) and must not find them.
        sys.path.insert(0, str(HERE.parent / "original_d2l"))
        from generate import _StubFinder

        sys.meta_path.insert(0, _StubFinder())
        import transformers
        from d2l import torch as d2l

        class TransformersModule(lightning.LightningModule):
            kind = "transformers"

            def __init__(self, lr: float = 0.01):
                super().__init__()
                self.save_hyperparameters()
                self.model = transformers.BertForPreTraining(transformers.BertConfig(**CONFIG))

            def training_step(self, batch, batch_index):
                tokens, segments, valid_lens, mlm_labels, nsp_labels = batch
                mask = (torch.arange(tokens.shape[1]) < valid_lens[:, None]).long()
                out = self.model(tokens, attention_mask=mask, token_type_ids=segments, labels=mlm_labels,
                                 next_sentence_label=nsp_labels)  # fmt: skip
                return out.loss

            def configure_optimizers(self):
                return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

        class D2LModule(lightning.LightningModule):
            kind = "d2l"

            def __init__(self, lr: float = 0.01):
                super().__init__()
                self.save_hyperparameters()
                self.net = d2l.BERTModel(CONFIG["vocab_size"], CONFIG["hidden_size"], CONFIG["intermediate_size"],
                                         CONFIG["num_attention_heads"], CONFIG["num_hidden_layers"], 0.1,
                                         CONFIG["max_position_embeddings"])  # fmt: skip
                self.loss = torch.nn.CrossEntropyLoss()
                with torch.no_grad():  # d2l's LazyLinear layers take their shapes from a first forward
                    self.net(
                        *(torch.from_numpy(INPUTS[k]) for k in ("tokens", "segments", "valid_lens", "pred_positions"))
                    )

            def training_step(self, batch, batch_index):
                tokens, segments, valid_lens, mlm_labels, nsp_labels = batch
                positions = torch.arange(2).expand(len(tokens), 2)
                _, mlm, nsp = self.net(tokens, segments, valid_lens, positions)
                return self.loss(mlm.reshape(-1, CONFIG["vocab_size"]), mlm_labels[:, :2].reshape(-1)) + self.loss(
                    nsp, nsp_labels
                )

            def configure_optimizers(self):
                return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

        generator = torch.Generator().manual_seed(0)
        torch.manual_seed(0)
        batches = []
        for _ in range(STEPS):
            tokens = torch.randint(0, CONFIG["vocab_size"], (4, 7), generator=generator)
            valid_lens = torch.randint(1, 8, (4,), generator=generator)
            segments = torch.randint(0, 2, (4, 7), generator=generator)
            labels = torch.randint(0, CONFIG["vocab_size"], (4, 7), generator=generator)
            batches.append((tokens, segments, valid_lens, labels, torch.randint(0, 2, (4,), generator=generator)))
        arrays = {f"inputs/{name}": array for name, array in INPUTS.items()}
        transformers_module, d2l_module = TransformersModule(), D2LModule()
        for module in (transformers_module, d2l_module):
            train(lightning, module, batches)
        outputs = pytorch_outputs(transformers_module.model)
        arrays.update({f"transformers/{name}": array for name, array in outputs.items()})
        net = d2l_module.net.double().eval()
        with torch.no_grad():
            found = net(*(torch.from_numpy(INPUTS[k]) for k in ("tokens", "segments", "valid_lens", "pred_positions")))
        arrays.update({f"d2l/{name}": value.numpy() for name, value in zip(("encoded", "mlm", "nsp"), found)})
    np.savez(OUT / "lightning.npz", **arrays)
    for path in sorted(OUT.glob("lightning*")):
        print(f"{path.relative_to(OUT)}: {path.stat().st_size} bytes")


def main() -> None:
    sys.path.insert(0, str(HERE.parent / "original_d2l"))
    from generate import in_release

    in_release("1.0.3", sys.executable, __file__)


if __name__ == "__main__":
    child() if sys.argv[1:] == ["--child"] else main()
