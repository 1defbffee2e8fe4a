"""transformers' BERT behind the common interface: canonical weights in, hooks on its modules, valid_lens as
its attention mask (the package's docstring says what it computes)."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import transformers

from ..backend.contract import (
    BackendModel,
    BERTOutput,
    Device,
    check_mixed_precision_option,
    matmul_precision,
    parse_device,
    prepare_weights,
    read_only,
)
from ..errors import CannotRunHere, UsageError
from ..files.formats.huggingface import expressible, hf_names, to_huggingface
from ..spec.config import BERTConfig
from ..spec.inputs import ModelInputs
from ..torch.backend import (
    TORCH_DTYPES,
    autocast,
    devices,
    gemm,
    gpu_info,
    synchronize,
    tf32_enabled,
    to_framework_device,
    to_numpy,
)

NAME = "transformers"
ATTENTIONS = ("eager", "sdpa")
# What bench times beside the plain build: transformers' fused attention.
BENCH_VARIANTS = {"sdpa": {"attention": "sdpa"}}
__all__ = ["NAME", "TransformersBERT", "build", "devices", "gemm", "kernel_eps", "supports", "synchronize"]


def supports(config: BERTConfig, device: str = "cpu") -> str | None:
    """The original BERT (the ``bert`` preset and its variants) only; every device torch has."""
    return expressible(config)


def kernel_eps(eps: float) -> float:
    """transformers' LayerNorm is torch's: it computes with exactly ``eps``."""
    return eps


def attention_mask(valid_lens: Any, T: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """valid_lens ((B,) or (B, T_q), NumPy or torch) as transformers' additive mask, (B, 1, T_q, T_k)."""
    if valid_lens is None:
        return None
    lens = torch.as_tensor(valid_lens, device=device)
    lens = lens[:, None] if lens.dim() == 1 else lens
    keep = torch.arange(T, device=device)[None, None, :] < lens[:, :, None]
    blocked = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device)
    return torch.where(keep, torch.zeros((), dtype=dtype, device=device), blocked)[:, None]


class TransformersBERT(BackendModel):
    """A transformers BERT (``.module``) holding canonical weights, run in eval mode without gradients."""

    backend = NAME

    def __init__(
        self,
        config: BERTConfig,
        module: torch.nn.Module,
        dtype: str,
        device: Device,
        torch_device: torch.device,
        tf32: bool = False,
        mixed_precision: str | None = None,
    ) -> None:
        super().__init__(config, dtype, device)
        self.module, self.torch_device, self.tf32, self.mixed_precision = module, torch_device, tf32, mixed_precision
        self.bert: Any = getattr(module, "bert", module)  # BertForPreTraining wraps a BertModel

    def _sources(self) -> OrderedDict[str, torch.nn.Module]:
        """Where each named activation is the output of a transformers module."""
        sources = OrderedDict(embedding=self.bert.embeddings)
        for i, layer in enumerate(self.bert.encoder.layer):
            sources[f"blks.{i}.attention"] = layer.attention.output.dense  # before its dropout and LayerNorm
            sources[f"blks.{i}.addnorm1"] = layer.attention.output
            sources[f"blks.{i}.ffn"] = layer.output.dense
            sources[f"blks.{i}.output"] = layer.output
        if self.bert.pooler is not None:
            sources["pooler"] = self.bert.pooler
        return sources

    def _forward(self, inputs: ModelInputs, intermediates: bool) -> BERTOutput:
        record: OrderedDict[str, np.ndarray | None] = OrderedDict()
        hooks = []
        if intermediates:
            for name, module in self._sources().items():
                record[name] = None

                def keep(module, args, output, name=name):
                    record[name] = to_numpy(output[0] if isinstance(output, tuple) else output)

                hooks.append(module.register_forward_hook(keep))
        try:
            encoded, mlm, nsp = self._run(*self._placed(inputs))
        finally:
            for hook in hooks:
                hook.remove()
        return BERTOutput(to_numpy(encoded), to_numpy(mlm), to_numpy(nsp), record if intermediates else None)

    def export_weights(self, share: bool = False) -> dict[str, np.ndarray]:
        state = self.module.state_dict()
        weights = {}
        for name, hf_name in hf_names(self.config).items():
            array = state[hf_name].detach().cpu().numpy()
            array = read_only(array) if share else array.copy()
            weights[name] = array[None] if name == "encoder.pos_embedding" else array
        return weights

    def framework_info(self) -> dict[str, object]:
        info: dict[str, object] = {
            "framework": f"transformers {transformers.__version__} (torch {torch.__version__})",
            "threads": torch.get_num_threads(),
            **matmul_precision(self.dtype, self.device, self.tf32, self.mixed_precision),
            "attention": self.bert.config._attn_implementation,
        }
        return info | gpu_info(self.device)

    def _placed(self, inputs: ModelInputs) -> tuple[dict[str, torch.Tensor | None], torch.Tensor | None]:
        """transformers' arguments on the model's device, and the predicted positions there."""
        tokens, segments, valid_lens, pred_positions = inputs
        arguments = {
            "input_ids": torch.from_numpy(tokens).to(self.torch_device),
            "token_type_ids": torch.from_numpy(segments).to(self.torch_device),
            "attention_mask": attention_mask(valid_lens, tokens.shape[1], TORCH_DTYPES[self.dtype], self.torch_device),
        }
        positions = None if pred_positions is None else torch.from_numpy(pred_positions).to(self.torch_device)
        return arguments, positions

    def _run(self, arguments: dict[str, Any], positions: torch.Tensor | None) -> tuple[Any, Any, Any]:
        """The forward: the encoding, and the class's own heads (its cls) where it has them, the MLM head on
        the predicted positions only, as d2l's MaskLM gathers before its MLP: the head is position-wise, so
        the values are those of its forward, without vocabulary logits for every token."""
        mlm = nsp = None
        heads: Any = getattr(self.module, "cls", None)  # BertForMaskedLM's holds predictions only, ForNSP's the other
        with torch.no_grad(), tf32_enabled(self.tf32), autocast(self.torch_device, self.mixed_precision):
            out = self.bert(**arguments)
            if hasattr(heads, "seq_relationship"):
                nsp = heads.seq_relationship(out.pooler_output)
            if hasattr(heads, "predictions") and positions is not None:
                rows = torch.arange(len(positions), device=self.torch_device)[:, None]
                mlm = heads.predictions(out.last_hidden_state[rows, positions])
        return out.last_hidden_state, mlm, nsp

    def on_device(self, inputs: ModelInputs) -> Callable[[], object]:
        arguments, positions = self._placed(inputs)

        def forward() -> object:
            outputs = self._run(arguments, positions)
            synchronize()
            return outputs

        return forward

    def at_precision(self, tf32: bool = False, mixed_precision: str | None = None) -> TransformersBERT:
        check_mixed_precision_option(mixed_precision, self.dtype)
        return TransformersBERT(self.config, self.module, self.dtype, self.device, self.torch_device, tf32,
                                mixed_precision)  # fmt: skip


def build(
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    device: str = "cpu",
    dtype: object = "float32",
    tf32: bool = False,
    gradients: bool = True,
    share: bool = False,
    mixed_precision: str | None = None,
    attention: str = "eager",
) -> TransformersBERT:
    """transformers' BERT for ``config`` holding exactly ``weights``, in ``dtype`` on ``device``;
    ``gradients=False``: its parameters do not require gradients. ``share`` changes nothing: the
    weights are copied into the modules transformers builds. ``attention``: transformers' attention
    implementation, "eager" (its reference code) or "sdpa" (``scaled_dot_product_attention``, a fused
    kernel); ``tf32``: float32 products in TF32 on a GPU (off unless asked for, as in the torch backend);
    ``mixed_precision="bfloat16"``: the forward under ``torch.autocast``."""
    if attention not in ATTENTIONS:
        raise UsageError(f"unknown attention {attention!r}: transformers' BERT offers {list(ATTENTIONS)}")
    reason = supports(config, device)
    if reason is not None:
        raise CannotRunHere(f"backend {NAME!r}: {reason}")
    dtype, weights = prepare_weights(config, weights, dtype)
    hf, arrays = to_huggingface(config, weights)
    target = parse_device(device)
    torch_device = to_framework_device(target)
    hf_config = transformers.BertConfig(**{k: v for k, v in hf.items() if k not in ("architectures", "dtype")})
    hf_config._attn_implementation = attention
    module: transformers.PreTrainedModel = (
        transformers.BertModel(hf_config, add_pooling_layer="pooler" in config.heads)
        if hf["architectures"] == ["BertModel"]
        else getattr(transformers, hf["architectures"][0])(hf_config)
    )
    module = module.to(TORCH_DTYPES[dtype]).eval()  # type: ignore[arg-type]  # transformers mistypes .to
    with warnings.catch_warnings():
        # load_state_dict copies each tensor into the module's own, so a read-only array is never written.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        state = {name: torch.from_numpy(array) for name, array in arrays.items()}
        missing, unexpected = module.load_state_dict(state, strict=False)
    # The decoder's weight is the tied word embedding; position_ids is a buffer; neither is a weight.
    missing = [
        name for name in missing if name not in ("cls.predictions.decoder.weight",) and "position_ids" not in name
    ]
    if missing or unexpected:
        raise RuntimeError(
            f"transformers' BERT and bert_multi's names disagree: missing {missing}, unexpected {unexpected}"
        )
    if config.semantics.mlm_decoder == "tied" and hasattr(module, "cls"):
        module.tie_weights()
    module.requires_grad_(gradients)
    module = module.to(torch_device)  # type: ignore[arg-type]  # transformers mistypes .to
    return TransformersBERT(config, module, dtype, target, torch_device, tf32, mixed_precision)
