"""Checkpoints: the formats, one module each behind one registry (``formats``), where a checkpoint's
tensors belong and what they imply (``layout``), and loading, inspecting and converting any checkpoint
(``checkpoints``). Reading a hostile file and writing atomically are the base's (``bert_multi.safe_files``),
and the canonical weight file is the schema's on disk (``bert_multi.spec.weight_file``)."""
