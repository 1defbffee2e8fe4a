"""What each difference between d2l's BERT and the original costs when it is ignored: the float64 oracle
on a random model of BERT-base's sizes in the ``bert`` preset, against the same model with one switch
set back to d2l's. Prints a table (the README's).

    .venv/bin/python docs/bert_differences.py
"""

from __future__ import annotations

import dataclasses

import numpy as np

import bert_multi as bm
from bert_multi.display import format_table
from bert_multi.engine.cases import get_case

DIFFERENCES = {
    "no LayerNorm after the embedding sum": dict(embedding_norm=False),
    "ReLU for GELU": dict(activation="relu"),
    "GELU's tanh approximation for its erf form": dict(activation="gelu_tanh"),
    "LayerNorm eps 1e-5 for 1e-12": dict(layer_norm_eps=1e-5),
}


def main() -> None:
    config = dataclasses.replace(bm.CONFIGS["base"], semantics="bert")
    weights = bm.random_weights(config, seed=0, dtype="float64")
    batch = get_case("mixed_valid_lens").batch(config, seed=0)
    reference = bm.load_backend("numpy").build(config, weights)(**batch)
    rows = []
    for what, change in DIFFERENCES.items():
        other = dataclasses.replace(config, semantics=dataclasses.replace(config.semantics, **change))
        kept = {name: array for name, array in weights.items() if name in bm.param_shapes(other)}
        out = bm.load_backend("numpy").build(other, kept)(**batch)
        rows.append(
            [what, *(f"{np.abs(getattr(out, k) - getattr(reference, k)).max():.2g}" for k in ("encoded", "mlm"))]
        )
    # A decoder of its own (here the embedding with its rows reversed) where the original ties it.
    own = dataclasses.replace(config, semantics=dataclasses.replace(config.semantics, mlm_decoder="own"))
    untied = dict(weights, **{"mlm.mlp.3.weight": weights["encoder.token_embedding.weight"][::-1]})
    out = bm.load_backend("numpy").build(own, {name: untied[name] for name in bm.param_shapes(own)})(**batch)
    rows.append(["a decoder not tied to the token embedding", *(
        f"{np.abs(getattr(out, k) - getattr(reference, k)).max():.2g}" for k in ("encoded", "mlm"))])  # fmt: skip
    print(f"{config}\ncase mixed_valid_lens; max abs difference from the original BERT, float64\n")
    print(format_table(["ignored", "encoder output", "MLM logits"], rows))


if __name__ == "__main__":
    main()
