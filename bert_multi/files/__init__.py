"""Files: reading hostile files and writing atomically (``safe``), the canonical weight file
(``weights``), the checkpoint formats, one module each behind one registry (``formats``), and loading,
inspecting and converting any checkpoint with what its tensors imply (``checkpoints``)."""
