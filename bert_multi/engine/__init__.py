"""The conformance engine: what ``conform``, ``compare``, ``gpu-check`` and the test suite run, on backends
and nothing else (it knows a model only through the backend contract; a user's port is one by the time it
gets here).

- ``cases``: the input cases, one list;
- ``compare``: the tolerance policy and the statistics of one comparison;
- ``results``: targets (a backend at a dtype, on a device, with its attention), checks and reports, and
  the comparisons a user's test suite calls (``compare_outputs``, ``assert_conforms``);
- ``conform``: a run, every case on every target against the float64 oracle and every pair against each
  other, weights moved both ways;
- ``lanes``: one dtype's part of a run on lanes, a backend in another environment's worker beside this
  process;
- ``ahead``: a backend that compiles for each input shape compiling what a run will ask of it, beside it;
- ``report``: reports for people, the verdict, the table, the failures and the plot.

Its arrows run one way: ``conform`` uses ``ahead`` and ``lanes`` (``ahead`` uses ``lanes`` too), they use
``results``, which uses ``compare``; nothing here imports the port verification above it
(``bert_multi.verify``).
"""
