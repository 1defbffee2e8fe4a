"""The drop-in modules of earlier generations: each generation's constructor signatures, as the chapter
and the pretraining section of that release call them, build the canonical model of its preset."""

import numpy as np
import pytest

from bert_multi import BERTConfig, load_backend, param_shapes, random_weights
from bert_multi.backend import framework_names
from bert_multi.backend.registry import not_in_process
from bert_multi.engine.cases import CASES
from bert_multi.engine.results import assert_conforms

# How each release's pretraining section builds its model (num_hiddens 128, as there), per signature style.
GLUON_STYLE = "d2l.BERTModel(vocab, num_hiddens=128, ffn_num_hiddens=256, num_heads=2, num_layers=2, dropout=0.2)"
SIZED = (
    "d2l.BERTModel(vocab, num_hiddens=128, norm_shape=[128], ffn_num_input=128, ffn_num_hiddens=256, num_heads=2, "
    "num_layers=2, dropout=0.2, key_size=128, query_size=128, value_size=128, hid_in_features=128, "
    "mlm_in_features=128, nsp_in_features=128)"
)
# (framework, module) -> (the preset it computes, how its release built the model)
MODULES = {
    ("torch", "d2l_0_11"): ("d2l-0.11", GLUON_STYLE),
    ("torch", "d2l_0_12"): ("d2l-0.12", GLUON_STYLE),
    ("torch", "d2l_0_17"): ("d2l", SIZED),
    ("mxnet", "d2l_0_11"): ("d2l-0.11", GLUON_STYLE),
    ("mxnet", "d2l_0_12"): ("d2l-0.12", GLUON_STYLE),
    ("mxnet", "d2l_0_17"): ("d2l", GLUON_STYLE),
    ("jax", "d2l_0_11"): ("d2l-0.11", GLUON_STYLE),
    ("jax", "d2l_0_12"): ("d2l-0.12", GLUON_STYLE),
    ("jax", "d2l_0_17"): ("d2l", GLUON_STYLE),
}


def in_process(framework):
    """The framework's package in this process (a backend run by a worker in another environment has no
    classes here to call), else a skip saying why."""
    import importlib

    reason = not_in_process(framework)
    if reason:
        pytest.skip(reason)
    return importlib.import_module(f"bert_multi.{framework}")


@pytest.fixture(params=sorted(MODULES), ids=[f"{f}.{m}" for f, m in sorted(MODULES)])
def module(request):
    framework, name = request.param
    in_process(framework)
    import importlib

    return framework, importlib.import_module(f"bert_multi.{framework}.{name}"), *MODULES[request.param]


def test_the_release_signature_builds_the_canonical_model_of_its_preset(module):
    framework, d2l, preset, build = module
    net = eval(build, {"d2l": d2l, "vocab": 37})
    config = BERTConfig(37, 128, 256, 2, 2, dropout=0.2, semantics=preset)
    weights = random_weights(config, seed=1)
    batch = CASES[0].batch(config, seed=1)
    if framework == "torch":
        import torch

        assert list(net.state_dict()) == list(param_shapes(config))  # canonical names, in canonical order
        net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
        net.eval()
        with torch.no_grad():
            outputs = [t.numpy() for t in net(*(torch.from_numpy(batch[k]) for k in batch))]
    elif framework == "jax":
        import jax

        from bert_multi.jax import to_flax

        # Framework difference: the parameters are not in the module; init makes a tree for these inputs.
        made = net.init(jax.random.key(0), *batch.values())["params"]
        shapes = jax.tree_util.tree_map(lambda a: a.shape, (dict(made), to_flax(config, weights)))
        assert shapes[0] == shapes[1]
        outputs = [np.asarray(a) for a in net.apply({"params": to_flax(config, weights)}, *batch.values())]
    else:
        import mxnet as mx

        net.initialize()
        inputs = [mx.np.array(batch[k], dtype="float32" if k == "valid_lens" else None) for k in batch]
        net(*inputs)  # deferred shapes, as Gluon code of that release expects
        params = net._collect_params_with_prefix()
        names = framework_names(config, load_backend("mxnet").NAME_RULES)
        assert set(params) == set(names.values())
        for name, array in weights.items():
            params[names[name]].set_data(mx.np.array(array))
        outputs = [a.asnumpy() for a in net(*inputs)]
    reference = load_backend("numpy").build(config, weights)(**batch)
    assert_conforms(type(reference)(*outputs), reference, "float32")


def test_0_17_widths_that_disagree_with_num_hiddens_are_explained():
    in_process("torch")
    from bert_multi.torch import d2l_0_17 as d2l

    with pytest.raises(ValueError, match=r"key_size=768, but BERT's blocks read and write num_hiddens=128"):
        d2l.BERTModel(37, 128, [128], 128, 256, 2, 2, 0.2)  # the release's 768 defaults, left as they were


@pytest.mark.parametrize("framework", ["torch", "mxnet", "jax"])
def test_tiling_is_the_releases_own_code_path(framework):
    """d2l 0.12's MultiHeadAttention tiles valid_lens: same weights, different rows masked."""
    in_process(framework)
    import importlib

    old = importlib.import_module(f"bert_multi.{framework}.d2l_0_12")
    new = importlib.import_module(f"bert_multi.{framework}")
    assert old.MultiHeadAttention(8, 2, 0.0).valid_lens_over_heads == "tiled"
    assert new.MultiHeadAttention(8, 2, 0.0).valid_lens_over_heads == "interleaved"
