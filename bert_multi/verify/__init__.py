"""Port verification: holding a user's own BERT, in its own names, to the float64 oracle, which is what
``bert-multi verify``, ``bm.verify`` and the pytest fixture ``bert_verify`` run.

- ``subject``: what a user's model wrapped for verification provides (the framework packages' ``user.py``
  files build one, and import nothing else of this package);
- ``map_file`` and ``mapping``: where each canonical tensor lives in the user's model, from a map file's
  rules, names, or the order and shapes of its parameters;
- ``user``: the wrapped model as a backend of the contract, so that the conformance engine runs it;
- ``gradients``: its gradients against the float64 backward, and the loss it is given;
- ``mistakes`` and ``roles``: the catalogue of known mistakes, and each module of the user's model
  diagnosed on the oracle's own input;
- ``masking``: a user's masking function held to BERT's rule;
- ``repro``: a script reproducing a failure;
- ``session``: one run of all of it, and its report.

Its arrows run down to the engine (``bert_multi.engine``), never up from it.
"""

import importlib
import sys

# The engine's modules lived here until the engine became a package of its own: their old names stay
# importable (``from bert_multi.verify.cases import CASES``), so users' code does not break.
for _moved in ("cases", "compare", "conform", "lanes", "results", "report"):
    sys.modules[f"{__name__}.{_moved}"] = globals()[_moved] = importlib.import_module(f"bert_multi.engine.{_moved}")
