"""A BERT fine-tuned with PEFT 0.21's LoRA (``conformance/original_bert/peft_lora.py`` wrote the files; this
suite only reads them): its adapter's directory, the adapter's file alone, and the PEFT model's whole
state_dict. None is a model bert_multi reads; each is named, with PEFT's call that merges the adapter into
its base and saves the whole (which the generator ran, from the message, and checked), and no wrapper's prefix
is suggested for the PEFT model's ``base_model.model.``."""

import os
import re
import shutil
from pathlib import Path

import pytest

from bert_multi import WeightsError, inspect_checkpoint

HERE = Path(__file__).parent / "original_bert" / "checkpoints"
ADAPTER = HERE / "peft-adapter"


def test_an_adapters_directory_is_named_with_pefts_call_that_merges_it():
    expected = (
        f"{ADAPTER}: is a PEFT adapter (adapter_config.json: low-rank matrices that fine-tune a model they leave "
        "unchanged), not a model, which bert_multi does not merge: PEFT merges it into the model it adapts and "
        "saves the whole, which bert_multi reads: "
        f"peft.PeftModel.from_pretrained(base, {os.path.abspath(ADAPTER)!r}).merge_and_unload()"
        ".save_pretrained('merged'), base being the model it adapts"
    )
    with pytest.raises(WeightsError, match=re.escape(expected)):
        inspect_checkpoint(ADAPTER)


def test_a_trainers_output_under_peft_names_its_adapter_checkpoints(tmp_path):
    """transformers' Trainer saves a PEFT model's checkpoint-N/ as its adapter's directory: the run's output names
    them, and each names the merge."""
    for step in (4, 2):
        shutil.copytree(ADAPTER, tmp_path / "output" / f"checkpoint-{step}")
        (tmp_path / "output" / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    with pytest.raises(WeightsError, match=re.escape("it holds ['checkpoint-2/', 'checkpoint-4/'], which bert_multi")):
        inspect_checkpoint(tmp_path / "output")
    with pytest.raises(WeightsError, match="is a PEFT adapter"):
        inspect_checkpoint(tmp_path / "output" / "checkpoint-2")


def test_a_model_read_beside_its_adapter_says_the_adapter_is_not_merged(tmp_path):
    """An adapter saved into its base model's directory: the model is read, and a note says what is not in it."""
    shutil.copytree(HERE / "tf-safetensors", tmp_path / "model")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(ADAPTER / name, tmp_path / "model" / name)
    info = inspect_checkpoint(tmp_path / "model")
    assert info.format == "hf-dir"
    assert info.notes[-1] == (
        "read the model without the PEFT adapter beside it (adapter_config.json), which it does not merge"
    )


@pytest.mark.parametrize("path", [ADAPTER / "adapter_model.safetensors", HERE / "peft-model.safetensors"])
def test_loras_matrices_are_named_and_no_prefix_is_suggested(path):
    with pytest.raises(WeightsError, match="they are a PEFT model's or adapter's: LoRA's lora_A and lora_B") as caught:
        inspect_checkpoint(path)
    assert "prefix=" not in str(caught.value) and "merge_and_unload()" in str(caught.value)
