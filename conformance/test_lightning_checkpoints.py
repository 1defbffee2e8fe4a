"""BERTs trained with PyTorch Lightning 2.6 and saved as its checkpoints (``conformance/original_bert/
lightning_bert.py`` wrote them; this suite only reads them): transformers' ``BertForPreTraining`` held as
``self.model``, and d2l 1.0.3's own ``BERTModel`` held as ``self.net``, each after two Adam steps. The
state_dict is under the checkpoint's key ``state_dict`` and every name under the module's attribute, which
the first read names together; once both are stated, the float64 oracle computes from each file what the
trained model computed in float64."""

from pathlib import Path

import numpy as np
import pytest

from bert_multi import WeightsError, convert, load_checkpoint
from bert_multi.backend.registry import load_backend
from bert_multi.cli import main
from bert_multi.engine.compare import compare_arrays, tolerance_for
from conftest import pretraining_outputs, runs_here

HERE = Path(__file__).parent / "original_bert" / "checkpoints"
with np.load(HERE / "lightning.npz", allow_pickle=False) as archive:
    SAVED = {name: archive[name] for name in archive.files}


def saved(part: str) -> dict[str, np.ndarray]:
    return {name.removeprefix(f"{part}/"): array for name, array in SAVED.items() if name.startswith(f"{part}/")}


# (checkpoint, the attribute holding the model, the statements its family needs beside the heads)
MODELS = {
    "transformers": ("model.", {}),
    "d2l": ("net.", {"d2l_version": "1.0.3"}),
}


@pytest.mark.parametrize("kind", MODELS)
def test_a_lightning_checkpoint_computes_what_the_trained_model_computed(kind):
    prefix, statements = MODELS[kind]
    path = HERE / f"lightning-{kind}.ckpt"
    checkpoint = load_checkpoint(path, key="state_dict", prefix=prefix.rstrip("."), num_heads=2, **statements)
    config = checkpoint.config
    assert (config.vocab_size, config.num_hiddens, config.ffn_num_hiddens, config.num_blks) == (13, 8, 12, 2)
    assert config.heads == ("pooler", "mlm", "nsp")
    assert checkpoint.info.notes[:2] == [
        "read the state_dict under the key 'state_dict'",
        f"read the tensors under the prefix {prefix!r} without it",
    ]
    out = load_backend("numpy").build(config, checkpoint.weights, dtype="float64")(**saved("inputs"))
    outputs = saved(kind)
    assert set(outputs) == {"encoded", "mlm", "nsp"}
    for name, theirs in outputs.items():
        comparison = compare_arrays(name, getattr(out, name), theirs, tolerance_for("float64", "cpu"))
        assert comparison.passed, comparison.describe()


@pytest.mark.parametrize("kind", MODELS)
def test_the_first_read_names_both_the_key_and_the_prefix_and_each_later_one_what_is_left(kind):
    prefix, statements = MODELS[kind]
    path = HERE / f"lightning-{kind}.ckpt"
    with pytest.raises(
        WeightsError,
        match=f"the state_dict is under \\['state_dict'\\], its BERT's names under '{prefix}' \\(a wrapper's "
        f"attribute: a LightningModule's\\): pass key='state_dict', prefix='{prefix}' "
        f"\\(--key state_dict --prefix {prefix}\\)$",
    ):
        load_checkpoint(path, num_heads=2, **statements)
    with pytest.raises(WeightsError, match=f"under '{prefix}'.*state it, prefix='{prefix}' \\(--prefix {prefix}\\)"):
        load_checkpoint(path, key="state_dict", num_heads=2, **statements)
    with pytest.raises(
        WeightsError, match=f"no tensor name begins with 'encoder.'; the file's names begin with \\['{prefix}'\\]"
    ):
        load_checkpoint(path, key="state_dict", prefix="encoder", num_heads=2, **statements)


def test_the_command_line_converts_one_to_a_file_of_the_same_weights(tmp_path, capsys):
    path = HERE / "lightning-d2l.ckpt"
    target = tmp_path / "bert.npz"
    arguments = ["--key", "state_dict", "--prefix", "net.", "--num-heads", "2", "--d2l-version", "1.0.3"]
    assert main(["convert", str(path), str(target), *arguments]) == 0
    assert "note: read the tensors under the prefix 'net.' without it" in capsys.readouterr().out
    read = load_checkpoint(path, key="state_dict", prefix="net.", num_heads=2, d2l_version="1.0.3")
    converted = load_checkpoint(target)
    assert converted.config == read.config
    assert all(np.array_equal(converted.weights[name], array) for name, array in read.weights.items())


@runs_here("transformers")
def test_the_transformers_bert_of_a_lightning_run_converts_to_a_directory_transformers_loads(tmp_path):
    """Brought out of the run: a directory transformers' own from_pretrained loads, computing what the trained
    model computed."""
    import transformers

    path = HERE / "lightning-transformers.ckpt"
    convert(path, tmp_path / "hf", key="state_dict", prefix="model.", num_heads=2, framework="huggingface")
    model = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf", attn_implementation="eager")
    computed = pretraining_outputs(model.double().eval(), saved("inputs"))
    assert computed.keys() == saved("transformers").keys()
    for name, theirs in saved("transformers").items():
        comparison = compare_arrays(name, computed[name], theirs, tolerance_for("float64", "cpu"))
        assert comparison.passed, comparison.describe()
