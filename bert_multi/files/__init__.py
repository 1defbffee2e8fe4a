"""Files: reading hostile files and writing atomically (``safe``), the canonical weight file
(``weights``), and every checkpoint format bert_multi reads and writes (``checkpoints``, with Gluon's
``gluon_params`` and HuggingFace's ``huggingface``)."""
