"""The toy BERT and the inputs the generators beside this file save and run (each in a throw-away
environment of its own software, importing this file from beside it): one source for the sizes and the
inputs their fixtures share, so that one test reads every fixture with the same inputs."""

import numpy as np

# transformers' BertConfig fields (pytorch-pretrained-bert's too, vocab_size aside).
CONFIG = {
    "vocab_size": 13, "hidden_size": 8, "intermediate_size": 12, "num_attention_heads": 2, "num_hidden_layers": 2,
    "max_position_embeddings": 16,
}  # fmt: skip
INPUTS = {
    "tokens": np.array([[2, 5, 7, 1, 12, 3, 9], [0, 4, 4, 11, 6, 8, 10], [3, 1, 2, 7, 5, 0, 6]]),
    "segments": np.array([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0, 0], [0] * 7]),
    "valid_lens": np.array([7, 5, 1]),  # a full row, a padded one, only <cls>
    "pred_positions": np.array([[1, 2], [0, 4], [0, 0]]),
}


def attention_mask() -> np.ndarray:
    """``INPUTS``' valid lengths as the 0/1 attention mask transformers takes (right padding)."""
    tokens = INPUTS["tokens"]
    return (np.arange(tokens.shape[1])[None, :] < INPUTS["valid_lens"][:, None]).astype(np.int64)


def pytorch_outputs(model) -> dict[str, np.ndarray]:
    """A transformers PyTorch BERT's outputs in float64 at ``INPUTS``: the encoding, and where its class has
    them, the MLM logits at the predicted positions and the NSP logits."""
    import torch

    model = model.double().eval()
    with torch.no_grad():
        out = model(torch.from_numpy(INPUTS["tokens"]), attention_mask=torch.from_numpy(attention_mask()),
                    token_type_ids=torch.from_numpy(INPUTS["segments"]), output_hidden_states=True)  # fmt: skip
    found = {"encoded": out.hidden_states[-1].numpy()}
    if hasattr(out, "prediction_logits"):
        rows = np.arange(len(INPUTS["tokens"]))[:, None]
        found["mlm"] = out.prediction_logits.numpy()[rows, INPUTS["pred_positions"]]
        found["nsp"] = out.seq_relationship_logits.numpy()
    return found
