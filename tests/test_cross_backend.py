"""PyTorch against MXNet directly, and weights moved between them in memory and through files."""

import pytest

from bert_multi import CONFIGS, BERTConfig, backends, load_backend, load_weights, random_weights, save_weights
from bert_multi.cases import CASES
from bert_multi.conform import assert_conforms

missing = [name for name in ("torch", "mxnet") if not backends()[name].available]
if missing:
    pytest.skip(f"needs both frameworks; unavailable: {missing}", allow_module_level=True)

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
        tmp_path / "torch.pt", CONFIG, mxnet_backend.load_checkpoint(tmp_path / "gluon.params", CONFIG)
    )
    final = torch_backend.load_checkpoint(tmp_path / "torch.pt", CONFIG)
    assert all(final[name].tobytes() == original[name].tobytes() for name in original)
