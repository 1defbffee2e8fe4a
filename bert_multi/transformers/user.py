"""A user's own transformers BERT (``BertForPreTraining``, ``BertModel``, ``BertForMaskedLM``,
``BertForNextSentencePrediction``, or one fine-tuned for a task), wrapped for ``bert-multi verify``: seen
through ``D2LView`` as d2l's call (tokens, segments, valid_lens, pred_positions) -> (encoded, mlm, nsp),
and otherwise wrapped as any PyTorch model."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..files.formats.transformers_names import TASK_HEADS
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
        # Each class names its heads' outputs its own way: both (BertForPreTraining), the masked LM's or the
        # next-sentence classifier's alone as ``logits`` (BertForMaskedLM, BertForNextSentencePrediction), or
        # none (BertModel).
        heads = type(getattr(self.model, "cls", None)).__name__
        vocabulary = out.prediction_logits if hasattr(out, "prediction_logits") else None
        nsp = out.seq_relationship_logits if hasattr(out, "seq_relationship_logits") else None
        if heads == "BertOnlyMLMHead":
            vocabulary = out.logits
        elif heads == "BertOnlyNSPHead":
            nsp = out.logits
        mlm = None
        if vocabulary is not None and pred_positions is not None:
            rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None]
            mlm = vocabulary[rows, pred_positions]
        return encoded, mlm, nsp


def wrap_user_model(model: Any, dtype: str, device: str, example: ModelInputs, copied: bool) -> WrappedModel:
    """``model`` (a transformers BERT) seen the d2l way and wrapped as a PyTorch model; of a model fine-tuned
    for a task (a ``TASK_HEADS`` head on its BertModel, ``bert``, which d2l's BERT has no counterpart for),
    its BertModel."""
    model = copy.deepcopy(model) if copied else model
    task_head = next((name for name in TASK_HEADS if hasattr(model, name) and hasattr(model, "bert")), None)
    bert = model.bert if task_head else model
    wrapped = WrappedModel(D2LView(bert), dtype, device, example, copied=False)
    if isinstance(getattr(bert, "pooler", None), nn.Module):  # a BertModel's BertPooler: its dense, then tanh
        wrapped.pooled_at = "model.pooler"
    if task_head:
        wrapped.framework += f" ({type(model).__name__}: its BertModel, without its task head {task_head!r})"
    return wrapped
