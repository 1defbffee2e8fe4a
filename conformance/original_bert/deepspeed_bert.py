"""BERTs trained with DeepSpeed and saved by its ``engine.save_checkpoint``, and what each computes after
training: the fixtures of ``conformance/test_deepspeed_checkpoints.py``, which only reads them.

    .venv/bin/python conformance/original_bert/deepspeed_bert.py     write checkpoints/deepspeed-*

transformers' ``BertForPreTraining`` at the toy sizes of ``toy_bert.py``, trained ``STEPS`` steps on random
batches by DeepSpeed's engine (its ``Adam``, on the CPU, one process over gloo), at two ZeRO stages:

- ``checkpoints/deepspeed-zero2/``: ZeRO stage 2. ``latest`` names the save (``global_step2``), whose
  folder holds the model's states (``mp_rank_00_model_states.pt``: a ``torch.save`` dict, the model's
  state_dict under ``module``) beside the optimizer's (``zero_pp_rank_0_mp_rank_00_optim_states.pt``, which
  pickles DeepSpeed's own classes);
- ``checkpoints/deepspeed-zero3/``: ZeRO stage 3, whose model's states hold empty tensors (each rank keeps
  its part of the weights among its optimizer's states); only ``latest`` and the model's states are kept;
- ``checkpoints/deepspeed.npz``: the inputs of ``toy_bert.py``, and each trained model's outputs on them in
  float64 (the encoding, the MLM logits at the predicted positions, the NSP logits).

DeepSpeed copies its ``zero_to_fp32.py`` beside ``latest``; it is its own code and is not kept. bert_multi
refuses stage 3 with the command that gathers the weights into a file bert_multi reads: this script runs
that very command, from bert_multi's own message, and checks that the file it writes computes what the
trained model computed.

DeepSpeed 0.19.8 is an sdist: it is built (``DS_BUILD_OPS=0``: no compiled ops) into a throw-away virtual
environment that sees this environment's packages (torch, transformers), and the training runs there.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "checkpoints"
DEEPSPEED = ("deepspeed==0.19.8", "hjson==3.1.0", "ninja==1.13.2", "py-cpuinfo==9.0.0", "einops==0.8.2")
BUILD = ("wheel==0.48.0", "setuptools==84.2.1")
STAGES = (2, 3)
STEPS = 2


def train(stage: int) -> None:
    """``STEPS`` steps at ZeRO ``stage``, saved into ``checkpoints/deepspeed-zero{stage}``; its outputs too."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29_500 + stage), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")  # fmt: skip
    import deepspeed
    import torch
    import transformers

    sys.path.insert(0, str(HERE))
    from toy_bert import CONFIG, pytorch_outputs

    torch.manual_seed(0)
    model = transformers.BertForPreTraining(transformers.BertConfig(**CONFIG))
    deepspeed.init_distributed(dist_backend="gloo")
    config = {
        "train_batch_size": 4,
        "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    generator = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        tokens = torch.randint(0, CONFIG["vocab_size"], (4, 7), generator=generator)
        valid_lens = torch.randint(1, 8, (4,), generator=generator)
        mask = (torch.arange(7) < valid_lens[:, None]).long()
        out = engine(tokens, attention_mask=mask, token_type_ids=torch.randint(0, 2, (4, 7), generator=generator),
                     labels=torch.randint(0, CONFIG["vocab_size"], (4, 7), generator=generator),
                     next_sentence_label=torch.randint(0, 2, (4,), generator=generator))  # fmt: skip
        engine.backward(out.loss)
        engine.step()
    target = OUT / f"deepspeed-zero{stage}"
    shutil.rmtree(target, ignore_errors=True)
    engine.save_checkpoint(target)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=stage == 3):
        trained = transformers.BertForPreTraining(transformers.BertConfig(**CONFIG))
        trained.load_state_dict({name: tensor.detach().clone() for name, tensor in engine.module.state_dict().items()})
    np.savez(target.with_suffix(".npz"), **pytorch_outputs(trained))


def check_the_gathering_command(python: Path, scratch: Path) -> None:
    """Run the command that bert_multi's refusal of the stage-3 checkpoint gives, with DeepSpeed's Python, and
    hold the file it writes, read by bert_multi, to what the trained model computed."""
    from toy_bert import INPUTS

    import bert_multi as bm
    from bert_multi.backend.registry import load_backend

    try:
        bm.load_checkpoint(OUT / "deepspeed-zero3", num_heads=2)
    except bm.WeightsError as refusal:
        command = shlex.split(str(refusal).split("DeepSpeed gathers them: ", 1)[1].split(", then read ", 1)[0])
    else:
        raise AssertionError("a ZeRO stage 3 checkpoint was read")
    assert command[0] == "python" and command[command.index("OUT") - 1] == str(OUT / "deepspeed-zero3"), command
    command[0], command[command.index("OUT")] = str(python), str(scratch)
    subprocess.run(command, check=True)
    checkpoint = bm.load_checkpoint(scratch / "pytorch_model.bin", num_heads=2)
    out = load_backend("numpy").build(checkpoint.config, checkpoint.weights)(**INPUTS)
    with np.load(OUT / "deepspeed-zero3.npz") as saved:
        for name in saved.files:
            assert np.allclose(getattr(out, name), saved[name], rtol=0, atol=1e-9), name


def main() -> None:
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parents[1]))
    from toy_bert import INPUTS

    with tempfile.TemporaryDirectory() as directory:
        python = Path(directory) / "venv" / "bin" / "python"
        subprocess.run([sys.executable, "-m", "venv", python.parent.parent], check=True)
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
        Path(site, "project.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch, transformers
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, *BUILD], check=True)
        subprocess.run([*pip, "--no-build-isolation", *DEEPSPEED], check=True, env={**os.environ, "DS_BUILD_OPS": "0"})
        for stage in STAGES:
            subprocess.run([python, __file__, "--child", str(stage)], check=True)
        check_the_gathering_command(python, Path(directory) / "gathered")
    for stage in STAGES:
        for name in ("zero_to_fp32.py", "zero_to_torch.py"):  # DeepSpeed's own code
            (OUT / f"deepspeed-zero{stage}" / name).unlink()
    for path in (OUT / "deepspeed-zero3").glob("*/*_optim_states.pt"):
        path.unlink()  # stage 3's refusal reads none of it
    with np.load(OUT / "deepspeed-zero2.npz") as saved:
        arrays = {**{f"inputs/{k}": v for k, v in INPUTS.items()}, **{f"zero2/{k}": saved[k] for k in saved.files}}
    np.savez(OUT / "deepspeed.npz", **arrays)
    for stage in STAGES:
        (OUT / f"deepspeed-zero{stage}.npz").unlink()
    for path in sorted(OUT.glob("deepspeed*/**/*")) + [OUT / "deepspeed.npz"]:
        if path.is_file():
            print(f"{path.relative_to(OUT)}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    train(int(sys.argv[2])) if sys.argv[1:2] == ["--child"] else main()
