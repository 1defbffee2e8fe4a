"""What only the PyTorch backend has: d2l's lazy API, state_dict checkpoints, autograd, CUDA and TF32."""

import itertools

import numpy as np
import pytest

from bert_multi import (
    CONFIGS,
    BERTConfig,
    InputError,
    WeightsError,
    load_backend,
    param_shapes,
    random_weights,
)
from bert_multi.backend.registry import not_in_process
from bert_multi.engine.cases import CASES
from bert_multi.engine.results import assert_conforms

if not_in_process("torch"):
    pytest.skip(not_in_process("torch"), allow_module_level=True)

import torch  # noqa: E402

import bert_multi.torch as bt  # noqa: E402
from bert_multi.torch.backend import SkipInitialisers  # noqa: E402
from bert_multi.torch.model import DotProductAttention, FusedDotProductAttention  # noqa: E402

CONFIG = BERTConfig(vocab_size=37, num_hiddens=16, ffn_num_hiddens=24, num_heads=4, num_blks=2, dropout=0.3, max_len=12)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to PyTorch here")
cuda = pytest.mark.cuda


def d2l_model(config):
    return bt.BERTModel(*config.d2l_args())


@pytest.mark.parametrize("config", [CONFIG, CONFIGS["chapter"], CONFIGS["tiny"]], ids=["small", "chapter", "tiny"])
def test_state_dict_keys_are_the_canonical_schema(config):
    state = d2l_model(config).state_dict()
    assert list(state) == list(param_shapes(config))
    assert {name: tuple(t.shape) for name, t in state.items()} == param_shapes(config)


def test_chapter_code_runs_unchanged_with_lazy_layers():
    # The d2l chapter's own cells, with `d2l.` replaced by this backend.
    vocab_size, num_hiddens, ffn_num_hiddens, num_heads = 10000, 768, 1024, 4
    num_blks, dropout = 2, 0.2
    encoder = bt.BERTEncoder(vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout)
    tokens = torch.randint(0, vocab_size, (2, 8))
    segments = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1]])
    encoded_X = encoder(tokens, segments, None)
    assert encoded_X.shape == (2, 8, 768)
    mlm = bt.MaskLM(vocab_size, num_hiddens)  # lazy: input width inferred on the first call
    mlm_positions = torch.tensor([[1, 5, 2], [6, 1, 5]])
    mlm_Y_hat = mlm(encoded_X, mlm_positions)
    assert mlm_Y_hat.shape == (2, 3, 10000)
    mlm_Y = torch.tensor([[7, 8, 9], [10, 20, 30]])
    loss = torch.nn.CrossEntropyLoss(reduction="none")
    assert loss(mlm_Y_hat.reshape((-1, vocab_size)), mlm_Y.reshape(-1)).shape == (6,)
    nsp = bt.NextSentencePred()
    nsp_Y_hat = nsp(torch.flatten(encoded_X, start_dim=1))  # 6144 inputs, inferred lazily
    assert nsp_Y_hat.shape == (2, 2)
    attention = bt.MultiHeadAttention(100, 5, 0.5)
    attention.eval()
    X, Y = torch.ones((2, 4, 100)), torch.ones((2, 6, 100))
    assert attention(X, Y, Y, torch.tensor([3, 2])).shape == (2, 4, 100)
    assert bt.PositionWiseFFN(4, 8)(torch.ones((2, 3, 4))).shape == (2, 3, 8)


class Calls(torch.overrides.TorchFunctionMode):
    """Inside it, every torch function called, and what it returned: (name, result)."""

    def __enter__(self):
        super().__enter__()
        self.calls = []
        return self.calls

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        self.calls.append((getattr(func, "__name__", str(func)), result))
        return result


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_fused_attention_is_d2ls_and_copies_no_query(dtype):
    """Every row as d2l's written-out attention computes it; a row of valid_len 0 attending to every key
    alike, as d2l's -1e6 makes it, even where the scores are 1e12 (-1e30 outweighs them and they round away
    beside it; any score under 2**46 does in float64). Beside the kernel, nothing the size of the queries is
    computed: the mask is all the work (a copy of the queries was, once, in every block)."""
    generator = torch.Generator().manual_seed(0)
    B, h, T, d = 3, 2, 5, 16
    queries, keys, values = (torch.randn(B, h, T, d, generator=generator, dtype=dtype) for _ in range(3))
    for valid_lens in (torch.tensor([0, 3, 5]), torch.tensor([[0, 1, 2, 5, 0], [5, 5, 0, 3, 1], [4, 4, 4, 4, 4]])):
        with torch.no_grad(), Calls() as calls:
            fused = FusedDotProductAttention(0.0).eval()(queries, keys, values, valid_lens)
        written = DotProductAttention(0.0).eval()(
            *(x.reshape(B * h, T, d) for x in (queries, keys, values)), valid_lens.repeat_interleave(h, dim=0)
        )
        torch.testing.assert_close(fused, written.reshape(B, h, T, d))
        big = [name for name, out in calls if isinstance(out, torch.Tensor) and out.numel() >= queries.numel()]
        assert big == ["scaled_dot_product_attention"], calls
        # Scores of about 1e12, beyond what d2l's -1e6 masks in a row that keeps some keys.
        huge = FusedDotProductAttention(0.0).eval()(queries * 1e6, keys * 1e6, values, valid_lens)
        empty = (valid_lens == 0) if valid_lens.dim() == 2 else (valid_lens == 0)[:, None].expand(B, T)
        uniform = values.mean(dim=2, keepdim=True).expand(B, h, T, d)
        assert empty.any()
        torch.testing.assert_close(huge.transpose(1, 2)[empty], uniform.transpose(1, 2)[empty])


def test_a_d2l_checkpoint_loads_strictly_and_through_the_canonical_format(tmp_path):
    trained = d2l_model(CONFIG)  # stands for a d2l 1.0 model with its own torch initialisation
    torch.save(trained.state_dict(), tmp_path / "d2l.pt")
    fresh = d2l_model(CONFIG)
    fresh.load_state_dict(torch.load(tmp_path / "d2l.pt", weights_only=True), strict=True)
    weights = bt.load_checkpoint(tmp_path / "d2l.pt", CONFIG).weights
    assert all(np.array_equal(weights[n], t.detach().numpy()) for n, t in trained.state_dict().items())
    batch = CASES[0].batch(CONFIG)
    trained.eval()
    with torch.no_grad():
        expected = trained(*(None if v is None else torch.from_numpy(v) for v in batch.values()))
    got = bt.build(CONFIG, weights)(**batch)
    assert np.array_equal(got.encoded, expected[0].numpy()) and np.array_equal(got.nsp, expected[2].numpy())


def test_checkpoint_round_trip_and_errors(tmp_path):
    weights = random_weights(CONFIG, seed=1)
    bt.save_checkpoint(tmp_path / "w.pt", CONFIG, weights)
    loaded = bt.load_checkpoint(tmp_path / "w.pt", CONFIG).weights
    assert all(loaded[n].tobytes() == weights[n].tobytes() for n in weights)
    with pytest.raises(WeightsError, match=r"unexpected \['encoder.blks.1"):
        bt.load_checkpoint(tmp_path / "w.pt", BERTConfig(37, 16, 24, 4, 1, max_len=12))
    torch.save({"model": object()}, tmp_path / "pickled.pt")  # refused by weights_only, never unpickled
    with pytest.raises(WeightsError, match="not a readable PyTorch state_dict checkpoint"):
        bt.load_checkpoint(tmp_path / "pickled.pt", CONFIG)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsError, match="not a format bert_multi reads"):
        bt.load_checkpoint(tmp_path / "junk.pt", CONFIG)


def test_gradients_reach_every_parameter_including_the_positional_embedding():
    model = bt.build(CONFIG, random_weights(CONFIG, seed=2))
    module = model.module.train()
    batch = CASES[0].batch(CONFIG)
    encoded, mlm, nsp = module(*(None if v is None else torch.from_numpy(v) for v in batch.values()))
    (mlm.square().mean() + nsp.square().mean() + encoded.mean()).backward()
    for name, parameter in module.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_a_model_built_without_gradients_requires_none():
    assert all(p.requires_grad for p in bt.build(CONFIG, random_weights(CONFIG)).module.parameters())
    run_only = bt.build(CONFIG, random_weights(CONFIG), gradients=False).module
    assert not any(p.requires_grad for p in run_only.parameters())


def test_initialisers_are_skipped_only_inside_the_mode_and_only_in_its_thread():
    import threading

    def drawn() -> bool:
        tensor = torch.zeros(1000)
        torch.nn.init.normal_(tensor)
        return bool(tensor.abs().sum() > 0)

    other_thread: list[bool] = []
    with SkipInitialisers():
        assert not drawn()
        worker = threading.Thread(target=lambda: other_thread.append(drawn()))
        worker.start()
        worker.join()
    assert other_thread == [True] and drawn()


def test_dropout_acts_in_train_mode_only():
    model = bt.build(CONFIG, random_weights(CONFIG, seed=2))
    inputs = [None if v is None else torch.from_numpy(v) for v in CASES[1].batch(CONFIG).values()]
    module = model.module
    module.train()
    torch.manual_seed(0)
    first = module(*inputs)[0]
    second = module(*inputs)[0]
    assert not torch.equal(first, second)
    module.eval()
    assert torch.equal(module(*inputs)[0], module(*inputs)[0])


def test_cpu_dropout_drops_each_element_independently_at_its_rate_and_scales_the_rest():
    """The masks come from 16-bit slices of 64-bit draws: every slice of a draw must be uniform and
    independent of the others (a draw missing its top bit would never drop the fourth slice), the rate
    round(p * 2**16) / 2**16, and the kept elements scaled so that the expectation is the input."""
    dropout = bt.model.Dropout(0.2).train()
    rate = 13107 / 2**16  # round(0.2 * 2**16) / 2**16
    torch.manual_seed(0)
    X = torch.ones(2**22, requires_grad=True)
    Y = dropout(X)
    Y.sum().backward()
    dropped = (Y == 0).double()
    kept_value = 2**16 / (2**16 - 13107)
    assert torch.equal(Y[Y != 0], torch.full_like(Y[Y != 0], kept_value))
    assert torch.equal(X.grad, Y.detach())  # the gradient passes the same mask and scale
    per_slice = dropped.reshape(-1, 4)
    spread = 6 * (rate * (1 - rate) / per_slice.shape[0]) ** 0.5  # six standard deviations
    assert (per_slice.mean(0) - rate).abs().max() < spread, per_slice.mean(0)
    both = (per_slice[:, 0] * per_slice[:, 3]).mean()  # the first and last slice of each draw
    assert abs(both - rate**2) < 6 * (rate**2 / per_slice.shape[0]) ** 0.5
    assert abs(float(Y.detach().double().mean()) - 1) < 6 * (rate / (1 - rate) / X.numel()) ** 0.5
    torch.manual_seed(0)
    assert torch.equal(dropout(X), Y)  # seeded as torch's own dropout is
    assert dropout.eval()(X) is X
    assert torch.equal(bt.model.Dropout(1.0).train()(X), torch.zeros_like(X))


def test_tf32_context_restores_the_callers_setting():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with bt.tf32_enabled(True):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    with bt.tf32_enabled(False):
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


@cuda
@needs_cuda
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_cuda_matches_the_oracle_with_tf32_off(case, dtype):
    config = CONFIGS["chapter"] if case.name != "max_len" else CONFIGS["tiny"]
    weights = random_weights(config, seed=0, dtype="float64")
    batch = case.batch(config)
    ref = load_backend("numpy").build(config, weights)(**batch, intermediates=True)
    model = bt.build(config, weights, device="cuda", dtype=dtype)
    assert model.runtime_info()["tf32"] is False
    assert_conforms(model(**batch, intermediates=True), ref, dtype, device="cuda")
    exported = model.export_weights()
    assert all(exported[n].tobytes() == weights[n].astype(dtype).tobytes() for n in weights)


@cuda
@needs_cuda
def test_cuda_gradients_reach_every_parameter():
    module = bt.build(CONFIG, random_weights(CONFIG), device="cuda").module.train()
    inputs = [None if v is None else torch.from_numpy(v).cuda() for v in CASES[0].batch(CONFIG).values()]
    encoded, mlm, nsp = module(*inputs)
    (mlm.square().mean() + nsp.square().mean() + encoded.mean()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


def test_a_tensor_that_requires_grad_is_an_input_error_not_a_torch_error():
    model = bt.build(CONFIG, random_weights(CONFIG, seed=2))
    batch = CASES[0].batch(CONFIG)
    needs_grad = torch.tensor(batch["valid_lens"], dtype=torch.float32, requires_grad=True)
    with pytest.raises(InputError, match=r"^valid_lens is a torch.Tensor that NumPy cannot read .* \.detach\(\)"):
        model(batch["tokens"], batch["segments"], needs_grad, batch["pred_positions"])
    # Tensors NumPy can read are accepted like arrays.
    out = model(*(None if v is None else torch.from_numpy(v) for v in batch.values()))
    assert np.array_equal(out.encoded, model(**batch).encoded)


def test_a_checkpoint_in_the_legacy_format_loads_as_the_zip_one_does(tmp_path):
    """torch.save before PyTorch 1.6 (and with ``_use_new_zipfile_serialization=False``): pickles, then each
    storage's bytes; tied weights share a storage, saved once, read under both names."""
    weights = random_weights(CONFIG, seed=5)
    state = {name: torch.from_numpy(array) for name, array in weights.items()}
    state["tied.weight"] = state["encoder.token_embedding.weight"]
    torch.save(state, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    torch.save(state, tmp_path / "zip.pt")
    legacy, _, _ = bt.read_checkpoint(tmp_path / "legacy.pt")
    current, _, _ = bt.read_checkpoint(tmp_path / "zip.pt")
    assert legacy.keys() == current.keys() == state.keys()
    assert all(legacy[name].tobytes() == current[name].tobytes() for name in state)
    assert all(
        loaded.tobytes() == weights[n].tobytes()
        for n, loaded in bt.load_checkpoint(tmp_path / "legacy.pt", CONFIG).weights.items()
    )


def test_a_tensor_that_is_its_whole_storage_is_lent_to_numpy_and_a_part_of_one_is_copied(tmp_path):
    """Reading a file holds its tensors once: each whole storage is NumPy's array's memory, not copied; a
    view of part of a storage (torch.save keeps all of it) is copied, so that the rest is not kept."""
    big = torch.arange(1000, dtype=torch.float32)
    torch.save({"whole": torch.ones(3, 4), "part": big[10:20], "tied": big[10:20]}, tmp_path / "state.pt")
    arrays, _, _ = bt.read_checkpoint(tmp_path / "state.pt")
    assert not arrays["whole"].flags.owndata and arrays["whole"].tolist() == [[1.0] * 4] * 3
    assert arrays["part"].flags.owndata and arrays["part"].tolist() == list(range(10, 20))
    assert arrays["tied"] is arrays["part"]  # one view, copied once


def test_a_checkpoint_of_named_parameters_loads(tmp_path):
    """``torch.save(dict(model.named_parameters()))`` stores Parameters that require grad."""
    module = bt.build(CONFIG, random_weights(CONFIG, seed=3)).module
    torch.save(dict(module.named_parameters()), tmp_path / "parameters.pt")
    loaded = bt.load_checkpoint(tmp_path / "parameters.pt", CONFIG).weights
    assert all(np.array_equal(loaded[n], random_weights(CONFIG, seed=3)[n]) for n in loaded)


# torch.compile's graphs take tensors, never NumPy's arrays: the same PyTorch in both environments
# compiles the same graphs, so these run once, from the main environment.
once = pytest.mark.skipif(bool(not_in_process("mxnet")), reason="run once, from the main environment")


@once
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_compiled_forward_computes_what_the_oracle_does(dtype):
    """torch.compile's graphs (fullgraph, so nothing runs eagerly unseen) within the dtype's tolerance of
    the oracle, activations included; a second model of other weights reuses the graph with its own."""
    from torch._dynamo.utils import counters

    batch = CASES[3].batch(CONFIG)
    compiled_before = counters["stats"]["unique_graphs"]
    for seed in (5, 6):
        weights = random_weights(CONFIG, seed=seed)
        model = bt.build(CONFIG, weights, dtype=dtype, gradients=False, compile=True)
        oracle = load_backend("numpy").build(CONFIG, weights)
        assert_conforms(model(**batch, intermediates=True), oracle(**batch, intermediates=True), dtype)
        assert_conforms(model(**batch), oracle(**batch), dtype)  # without the activations' hooks: another graph
        assert model.runtime_info()["compiled"]
    assert counters["stats"]["unique_graphs"] > compiled_before, "nothing was compiled"


@once
def test_compiled_training_takes_the_steps_eager_training_takes():
    """A model built with compile=True trains through torch.compile (forward, loss and backward): its
    losses and weights after Adam's steps are eager training's within the float64 bound."""
    from torch._dynamo.utils import counters

    from bert_multi.training import PretrainingData, builtin_corpus, paragraphs_from_lines

    data = PretrainingData.from_paragraphs(paragraphs_from_lines(builtin_corpus(100)), max_len=16, seed=0)
    config = BERTConfig(len(data.vocab), num_hiddens=16, ffn_num_hiddens=24, num_heads=2, num_blks=2, max_len=16)
    weights = random_weights(config, seed=7)
    compiled_before = counters["stats"]["unique_graphs"]
    runs = []
    for compile in (False, True):
        trainer = bt.Pretrainer(bt.build(config, weights, dtype="float64", compile=compile), lr=2**-7)
        losses = [trainer.step(batch) for batch in itertools.islice(data.batches(8, seed=1), 3)]
        runs.append((losses, trainer.model.export_weights()))
    (eager_losses, eager), (compiled_losses, compiled) = runs
    assert np.allclose(compiled_losses, eager_losses, rtol=0, atol=1e-9)
    assert max(np.abs(compiled[name] - eager[name]).max() for name in eager) < 1e-9
    assert max(np.abs(eager[name] - weights[name]).max() for name in eager) > 1e-3  # the steps moved them
    assert counters["stats"]["unique_graphs"] > compiled_before, "nothing was compiled"
