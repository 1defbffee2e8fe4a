"""A user's own transformers BERT (``BertForPreTraining``, ``BertModel``, a fine-tuned copy), wrapped for
``bert-multi verify``: seen through ``D2LView`` as d2l's call (tokens, segments, valid_lens,
pred_positions) -> (encoded, mlm, nsp), and otherwise wrapped as any PyTorch model."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..spec.inputs import ModelInputs
from ..torch.user import WrappedModel
from .backend import attention_mask

# transformers' models are also nn.Modules; being nearer their own class, this wrapper is chosen first.
USER_MODELS = ("transformers.modeling_utils.PreTrainedModel",)


class D2LView(nn.Module):
    """A transformers BERT called as d2l's BERTModel: valid_lens become its additive attention mask, and
    the masked-LM logits are read at pred_positions. Its parameters are the model's, under ``model.``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens, segments, valid_lens=None, pred_positions=None):
        dtype = next(self.model.parameters()).dtype
        mask = attention_mask(valid_lens, tokens.shape[1], dtype, tokens.device)
        out = self.model(input_ids=tokens, token_type_ids=segments, attention_mask=mask, output_hidden_states=True)
        encoded = out.hidden_states[-1]
        if not hasattr(out, "seq_relationship_logits"):  # a BertModel: no heads
            return encoded, None, None
        mlm = None
        if pred_positions is not None:
            rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None]
            mlm = out.prediction_logits[rows, pred_positions]
        return encoded, mlm, out.seq_relationship_logits


def wrap_user_model(model: Any, dtype: str, device: str, example: ModelInputs, copied: bool) -> WrappedModel:
    """``model`` (a transformers BERT) seen the d2l way and wrapped as a PyTorch model."""
    return WrappedModel(D2LView(copy.deepcopy(model) if copied else model), dtype, device, example, copied=False)
