"""What the model is, framework-free: the generations' switches (``semantics``), the sizes (``config``),
the canonical weights (``schema``) and their file on disk (``weight_file``), the inputs and their checks
(``inputs``), the pretraining loss's rules (``loss``) and the earlier generations' constructor signatures
(``generations``)."""
