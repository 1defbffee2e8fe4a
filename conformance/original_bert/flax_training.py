"""A Flax BERT trained as Flax's users train one, saved by Flax's and Orbax's own checkpointing, and what it
computes after training: the fixtures of ``conformance/test_flax_checkpoints.py``, which only reads them.

    .venv-numpy2/bin/python conformance/original_bert/flax_training.py     write checkpoints/*flax*, *orbax*

The model is bert_multi's Flax BERT (``bert_multi/jax/model.py``, d2l 1.0's at the toy sizes of
``toy_bert.py``), in a ``flax.training.train_state.TrainState`` with ``optax.adam``, trained ``STEPS``
steps on random batches with the MLM and NSP cross-entropies. Saved three ways:

- ``checkpoints/flax-train-state/checkpoint_2``: ``flax.training.checkpoints.save_checkpoint`` as Flax
  saved before Orbax (``flax_use_orbax_checkpointing`` off): the TrainState's ``step``, ``params`` and
  ``opt_state`` as one MessagePack file;
- ``checkpoints/orbax-train-state/checkpoint_2/``: the same call with Orbax, Flax's default since;
- ``checkpoints/orbax-manager/2/default/``: an ``orbax.checkpoint.CheckpointManager``'s step of the
  variables dict (``{"params": ...}``), as Flax's documentation now saves a model;
- ``checkpoints/flax-train-state.npz``: the inputs of ``toy_bert.py`` and the trained model's outputs on them
  in float64 (the encoding, the MLM logits at the predicted positions, the NSP logits).

The NumPy-2 environment holds Flax, optax and Orbax (``requirements-numpy2.lock``). Orbax names its data
files at random and records the time of each save, so its directories differ from run to run; the
MessagePack file is the same bytes every time.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "checkpoints"
STEPS = 2
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

from toy_bert import CONFIG, INPUTS  # noqa: E402


def trained_state():  # noqa: ANN201 - a flax TrainState
    """The TrainState after ``STEPS`` Adam steps on random batches."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax.training import train_state

    from bert_multi.jax.model import BERTModel

    model = BERTModel(
        vocab_size=CONFIG["vocab_size"], num_hiddens=CONFIG["hidden_size"], ffn_num_hiddens=CONFIG["intermediate_size"],
        num_heads=CONFIG["num_attention_heads"], num_blks=CONFIG["num_hidden_layers"], dropout=0.0,
        max_len=CONFIG["max_position_embeddings"],
    )  # fmt: skip
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(INPUTS["tokens"])
    variables = model.init(jax.random.PRNGKey(0), tokens, jnp.asarray(INPUTS["segments"]),
                           jnp.asarray(INPUTS["valid_lens"]), jnp.asarray(INPUTS["pred_positions"]))  # fmt: skip
    state = train_state.TrainState.create(apply_fn=model.apply, params=variables["params"], tx=optax.adam(1e-2))

    def loss(params, batch):  # noqa: ANN001, ANN202
        _, mlm, nsp = state.apply_fn({"params": params}, batch["tokens"], batch["segments"], batch["valid_lens"],
                                     batch["pred_positions"], training=True)  # fmt: skip
        mlm_loss = optax.softmax_cross_entropy_with_integer_labels(mlm, batch["mlm_labels"]).mean()
        return mlm_loss + optax.softmax_cross_entropy_with_integer_labels(nsp, batch["nsp_labels"]).mean()

    for _ in range(STEPS):
        batch = {
            "tokens": rng.integers(0, CONFIG["vocab_size"], (4, 7)), "segments": rng.integers(0, 2, (4, 7)),
            "valid_lens": rng.integers(1, 8, 4), "pred_positions": rng.integers(0, 7, (4, 2)),
            "mlm_labels": rng.integers(0, CONFIG["vocab_size"], (4, 2)), "nsp_labels": rng.integers(0, 2, 4),
        }  # fmt: skip
        state = state.apply_gradients(grads=jax.grad(loss)(state.params, jax.tree.map(jnp.asarray, batch)))
    return state


def outputs(state) -> dict[str, np.ndarray]:  # noqa: ANN001
    """The trained model's outputs at ``INPUTS``, in float64."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)  # trained in float32, as saved; the outputs computed in float64
    params = jax.tree.map(lambda leaf: jnp.asarray(leaf, jnp.float64), state.params)
    encoded, mlm, nsp = state.apply_fn({"params": params}, *(jnp.asarray(INPUTS[name]) for name in
                                       ("tokens", "segments", "valid_lens", "pred_positions")))  # fmt: skip
    return {"encoded": np.asarray(encoded), "mlm": np.asarray(mlm), "nsp": np.asarray(nsp)}


def main() -> None:
    import flax
    import jax
    import orbax.checkpoint as ocp
    from flax.training import checkpoints

    state = trained_state()
    for name in ("flax-train-state", "orbax-train-state", "orbax-manager"):
        shutil.rmtree(OUT / name, ignore_errors=True)
    flax.config.update("flax_use_orbax_checkpointing", False)
    checkpoints.save_checkpoint(OUT / "flax-train-state", state, step=STEPS)
    flax.config.update("flax_use_orbax_checkpointing", True)
    checkpoints.save_checkpoint(OUT / "orbax-train-state", state, step=STEPS)
    with ocp.CheckpointManager(OUT / "orbax-manager") as manager:
        manager.save(STEPS, args=ocp.args.StandardSave({"params": state.params}))
    versions = {"flax": flax.__version__, "orbax-checkpoint": ocp.__version__, "jax": jax.__version__}
    np.savez(OUT / "flax-train-state.npz", **INPUTS, **outputs(state), versions=json.dumps(versions))
    print(f"wrote the Flax and Orbax checkpoints ({versions}) into {OUT}")


if __name__ == "__main__":
    main()
