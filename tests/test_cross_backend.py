"""PyTorch against MXNet directly, and weights moved between them in memory and through files."""

import pytest

from bert_multi import (
    CONFIGS,
    BERTConfig,
    load_backend,
    load_checkpoint,
    load_weights,
    random_weights,
    save_weights,
)
from bert_multi.backend.registry import not_in_process
from bert_multi.engine.cases import CASES
from bert_multi.engine.results import assert_conforms

missing = [reason for name in ("torch", "mxnet") if (reason := not_in_process(name))]
if missing:  # where one runs in another environment's worker, tests/test_environments.py pairs them
    pytest.skip(f"needs both frameworks in this process: {'; '.join(missing)}", allow_module_level=True)

torch_backend, mxnet_backend = load_backend("torch"), load_backend("mxnet")
CONFIG = BERTConfig(vocab_size=29, num_hiddens=20, ffn_num_hiddens=12, num_heads=5, num_blks=2, max_len=14)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_torch_and_mxnet_agree_pairwise(case, dtype):
    weights = random_weights(CONFIG, seed=8, dtype="float64")
    batch = case.batch(CONFIG, seed=3)
    from_torch = torch_backend.build(CONFIG, weights, dtype=dtype)(**batch, intermediates=True)
    from_mxnet = mxnet_backend.build(CONFIG, weights, dtype=dtype)(**batch, intermediates=True)
    assert_conforms(from_mxnet, from_torch, dtype, pair=True)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_chapter_model_agrees_pairwise(dtype):
    config = CONFIGS["chapter"]
    weights = random_weights(config, seed=1, dtype=dtype)
    batch = CASES[0].batch(config)
    assert_conforms(
        mxnet_backend.build(config, weights, dtype=dtype)(**batch, intermediates=True),
        torch_backend.build(config, weights, dtype=dtype)(**batch, intermediates=True),
        dtype,
        pair=True,
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_weights_travel_between_frameworks_bit_identically_in_memory(dtype):
    original = random_weights(CONFIG, seed=9, dtype=dtype)
    there = mxnet_backend.build(CONFIG, original, dtype=dtype).export_weights()
    back = torch_backend.build(CONFIG, there, dtype=dtype).export_weights()
    again = mxnet_backend.build(CONFIG, back, dtype=dtype).export_weights()
    for name in original:
        assert original[name].tobytes() == there[name].tobytes() == back[name].tobytes() == again[name].tobytes()


def test_weights_travel_between_frameworks_through_files(tmp_path):
    original = random_weights(CONFIG, seed=10, dtype="float64")
    save_weights(
        tmp_path / "from_mxnet.npz", CONFIG, mxnet_backend.build(CONFIG, original, dtype="float64").export_weights()
    )
    config, loaded = load_weights(tmp_path / "from_mxnet.npz")
    save_weights(
        tmp_path / "from_torch.npz", config, torch_backend.build(config, loaded, dtype="float64").export_weights()
    )
    assert (tmp_path / "from_mxnet.npz").read_bytes() == (tmp_path / "from_torch.npz").read_bytes()
    # and through each framework's own checkpoint format: Gluon .params -> torch state_dict -> canonical
    mxnet_backend.save_checkpoint(tmp_path / "gluon.params", CONFIG, original)
    torch_backend.save_checkpoint(
        tmp_path / "torch.pt", CONFIG, load_checkpoint(tmp_path / "gluon.params", CONFIG).weights
    )
    final = load_checkpoint(tmp_path / "torch.pt", CONFIG).weights
    assert all(final[name].tobytes() == original[name].tobytes() for name in original)


def test_a_small_variance_model_raises_no_false_alarm_between_the_frameworks(tmp_path, capsys):
    """MXNet's LayerNorm uses eps = float32(1e-5). On a model two units wide the frameworks' float64
    outputs then differ by 1.9e-8, nine times the pair tolerance, though each matches the oracle at
    its own eps. The pair comparison removes that known difference, so `compare` passes."""
    import numpy as np

    from bert_multi import tolerance_for
    from bert_multi.cli import main

    config = BERTConfig(vocab_size=7, num_hiddens=2, ffn_num_hiddens=3, num_heads=1, num_blks=1, max_len=9)
    weights = random_weights(config, seed=13, dtype="float64")
    batch = {
        "tokens": np.array([[2, 2, 6, 2, 1, 6], [0, 3, 2, 0, 5, 6], [5, 2, 3, 5, 2, 2]]),
        "segments": np.array([[1, 0, 1, 1, 0, 1], [0, 0, 1, 1, 1, 1], [1, 1, 0, 1, 0, 1]]),
        "valid_lens": np.array([4, 2, 6]),
        "pred_positions": np.array([[1, 0, 4], [0, 3, 4], [1, 2, 3]]),
    }
    raw = np.abs(
        torch_backend.build(config, weights, dtype="float64")(**batch).encoded
        - mxnet_backend.build(config, weights, dtype="float64")(**batch).encoded
    ).max()
    assert raw > 5 * tolerance_for("float64", pair=True).atol  # the alarm the raw comparison would raise
    save_weights(tmp_path / "small.npz", config, weights)
    np.savez(tmp_path / "batch.npz", **batch)
    code = main(
        [
            "compare",
            str(tmp_path / "small.npz"),
            "--inputs",
            str(tmp_path / "batch.npz"),
            "--dtypes",
            "float64",
            "--details",
            "--wide",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "FAIL" not in out and "LayerNorm eps corrected" in out, out
