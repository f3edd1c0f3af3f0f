"""The attention head kind (``attn``, display letter ``H``): one query head of any attention layer, GQA included.

- **Output**: ``blocks.{l}.attn.o.hook_in`` (``[batch, pos, head, d_head]``); head ``h`` owns channels
  ``h*d_head : (h+1)*d_head`` -- zeroing them equals zeroing those columns of ``o_proj``.
- **Pattern**: the post-softmax ``blocks.{l}.attn.hook_pattern`` (``[batch, head, q, k]``).
- **Masking**: the pattern of a head is multiplied by the mask (rows rescaled to sum 1 with
  ``renormalize``). Where the bridge computes attention itself (Llama-style rotary attention, Bamba)
  this is an edit of ``hook_pattern``. Where it delegates to the HF module and only reports the
  pattern afterwards (TransformerLens discards edits there, e.g. Jamba), a forward hook on the HF
  attention module adds ``o_proj((P' − P) V)`` to its output -- exact, the output being linear in the
  pattern -- and hands ``P'`` on to ``hook_pattern``. That path needs the HF module to return its
  weights (eager attention) and a single forward without a KV cache.
- **Reached attention** (Zamba2's shared block ``blocks.{l}.shared_attn``, Nemotron-H's
  ``blocks.{l}.mixer``): the bridge gives these modules no pattern or output-projection hook, so
  :meth:`AttentionAdapter.reach_plan` asks :mod:`gna_interp.models.reach` for ``hook_pattern`` (fired
  inside the module's eager attention, edits honoured) and ``o.hook_in`` / ``o.hook_out`` around
  ``o_proj``; from there on they are read, ablated and masked like bridged attention.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Callable

import torch
from jaxtyping import Float
from torch import Tensor

from gna_interp.errors import GnaError, UnsupportedArchitectureError
from gna_interp.models.arch import LayerSpec
from gna_interp.models.hf import bind_args, unwrap
from gna_interp.models.mixer import Hook, MaskOptions, MixerAdapter, PatternOptions, prepare_mask, shared_note
from gna_interp.models.mixer import InputSite, ReachPlan
from gna_interp.models.reach import can_hook_pattern, reached_kind

from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model, TokenBatch


def _masked_rows(pattern: Tensor, heads: dict["HeadRef", Any], renormalize: bool) -> dict["HeadRef", Tensor]:
    """``pattern[:, h] * mask`` for each head (rows rescaled to sum 1 when ``renormalize``)."""
    b, _, q, k = pattern.shape
    rows: dict[HeadRef, Tensor] = {}
    for h, mask in heads.items():
        row = pattern[:, h.head] * prepare_mask(mask, h, b, q, k, pattern.device).to(pattern.dtype)
        if renormalize:
            total = row.sum(-1, keepdim=True)
            row = torch.where(total > 0, row / total.clamp_min(torch.finfo(row.dtype).tiny), row)
        rows[h] = row
    return rows


def _pattern_hook(heads: dict["HeadRef", Any], renormalize: bool) -> Callable[..., Tensor]:
    """For bridges that compute attention themselves (the pattern goes through ``hook_pattern``)."""

    def hook(pattern: Tensor, hook: Any) -> Tensor:
        out = pattern.clone()
        for h, row in _masked_rows(pattern, heads, renormalize).items():
            out[:, h.head] = row
        return out

    return hook


def _honours_pattern_edits(component: Any) -> bool:
    """Whether editing ``hook_pattern`` changes this attention bridge's output.

    TransformerLens's base ``AttentionBridge`` delegates to the HF module and fires ``hook_pattern``
    after the fact (edits are discarded, e.g. Jamba); subclasses that override ``forward``
    (rotary Llama-style attention, ...) or HF modules that accept a ``pattern_fn`` run the pattern
    through the hook.
    """
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

    if reached_kind(component) is not None:  # hook_pattern fires inside the attention function (models/reach.py)
        return True
    if getattr(getattr(component, "original_component", None), "accepts_pattern_fn", False):
        return True
    return type(component).forward is not AttentionBridge.forward


def _delegated_attention_hook(spec: LayerSpec, heads: dict["HeadRef", Any],
                              renormalize: bool) -> Callable[..., Any]:
    """Torch forward hook on an HF attention module whose bridge ignores pattern edits.

    The HF module returns ``(o_proj(P V), P)``; the hook adds ``o_proj((P' - P) V)`` for the masked
    heads (exact: the output is linear in the pattern) and returns the masked pattern ``P'`` so
    that ``hook_pattern`` shows it.
    """
    group = spec.n_heads // max(spec.n_groups, 1)
    d = spec.head_dim

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if not (isinstance(output, tuple) and len(output) >= 2 and isinstance(output[1], Tensor)):
            raise GnaError(
                f"mask_pattern: {type(module).__name__} in layer {spec.layer} returned no attention weights, "
                f"so its pattern cannot be masked (load the model with attn_implementation='eager')")
        hidden, _ = bind_args(module, args, kwargs)
        weights = output[1]
        b, _, q, k = weights.shape
        if k != hidden.shape[1]:
            raise GnaError(f"mask_pattern masks a single full forward pass; layer {spec.layer} attended to "
                           f"{k} keys for {hidden.shape[1]} inputs (a KV cache is in use)")
        v = unwrap(module.v_proj)(hidden).view(b, k, -1, d).float()
        rows = _masked_rows(weights, heads, renormalize)
        delta = torch.zeros(b, q, spec.n_heads * d, dtype=torch.float32, device=weights.device)
        new_weights = weights.clone()
        for h, row in rows.items():
            delta[..., h.head * d:(h.head + 1) * d] = (row - weights[:, h.head]).float() @ v[:, :, h.head // group]
            new_weights[:, h.head] = row
        o_weight = unwrap(module.o_proj).weight
        fixed = output[0] + (delta.to(o_weight.dtype) @ o_weight.T).to(output[0].dtype)
        return (fixed, new_weights) + tuple(output[2:])

    return hook


def _head_layout(mod: Any) -> tuple[int, int, int] | None:
    """``(query heads, KV heads, d_head)`` of a Hugging Face attention module, from it or its config."""
    cfg = getattr(mod, "config", None)
    n_heads = (getattr(mod, "num_heads", None) or getattr(mod, "n_heads", None) or getattr(mod, "n_head", None)
               or getattr(cfg, "num_attention_heads", None))  # n_heads: MPT; n_head: OpenAI GPT
    if not isinstance(n_heads, int) or n_heads < 1:
        return None
    n_kv = getattr(mod, "num_key_value_heads", None) or getattr(cfg, "num_key_value_heads", None) or n_heads
    head_dim = getattr(mod, "head_dim", None) or (getattr(cfg, "hidden_size", 0) // n_heads)
    if not head_dim:
        return None
    return int(n_heads), int(n_kv), int(head_dim)


class AttentionAdapter(MixerAdapter):
    """Query heads of a bridged attention component (``blocks.{l}.attn``)."""

    kind = "attn"
    letter = "H"
    title = "attention heads"
    label = "attention head"
    unit = "query heads"
    axis = "query head"
    normalized_rows = True
    splittable_cache = True
    separate_heads = True

    def detect(self, layer: int, name: str, component: Any) -> LayerSpec | None:
        mod = unwrap(component)
        if mod is component or (name != "attn" and reached_kind(component) != self.kind):
            return None
        layout = _head_layout(mod)
        if layout is None:
            return None
        return LayerSpec(layer, self.kind, *layout, 0, f"blocks.{layer}.{name}", type(mod).__name__)

    def describe(self, spec: LayerSpec) -> str:
        return (f"attention: {spec.n_heads} query heads, {spec.n_groups} KV heads, d_head {spec.head_dim}"
                + shared_note(spec))

    def reach_plan(self, module: torch.nn.Module) -> ReachPlan | None:
        """Attention modules with ``q_proj``/``k_proj``/``v_proj``/``o_proj`` whose weights go through an
        eager attention function: ``hook_pattern`` and ``o.hook_in`` are reached."""
        projections = ("q_proj", "k_proj", "v_proj", "o_proj")
        if not all(isinstance(getattr(module, p, None), torch.nn.Module) for p in projections):
            return None
        layout = _head_layout(module)
        o_proj = unwrap(module.o_proj)
        if layout is None or not can_hook_pattern(module) or getattr(o_proj, "in_features", None) != layout[0] * layout[2]:
            return None
        return ReachPlan("attn", {"o": "o_proj"}, pattern=True, required=("hook_pattern", "o.hook_in"))

    def output_hook(self, spec: LayerSpec) -> str:
        return f"{spec.bridge_path}.o.hook_in"

    def pattern_hooks(self, spec: LayerSpec) -> list[str]:
        return [f"{spec.bridge_path}.hook_pattern"]

    def receiver_inputs(self, model: "Model", spec: LayerSpec, head: "HeadRef") -> dict[str, list[InputSite]]:
        """``q``: the query head's channels of ``q.hook_out``; ``k``/``v``: its KV group's channels of
        ``k.hook_out``/``v.hook_out`` (the projections' outputs, before rotary embeddings). Where a query or key
        norm spans every head (OLMo-2), the head's query or key depends on every head's projection, so it is read
        after that norm (``q_norm.hook_out`` / ``k_norm.hook_out``): computed wholly from the receiver's stream."""
        d, group = spec.head_dim, spec.n_heads // max(spec.n_groups, 1)
        g = head.head // group
        module = model.hf_module(spec.bridge_path)

        def site(name: str) -> str:
            weight = getattr(getattr(module, f"{name}_norm", None), "weight", None)
            spans = isinstance(weight, torch.Tensor) and weight.numel() > d
            return f"{spec.bridge_path}.{name}_norm.hook_out" if spans else f"{spec.bridge_path}.{name}.hook_out"

        out = {"q": [InputSite(site("q"), head.head * d, (head.head + 1) * d)],
               "k": [InputSite(site("k"), g * d, (g + 1) * d)],
               "v": [InputSite(f"{spec.bridge_path}.v.hook_out", g * d, (g + 1) * d)], "other": []}
        missing = [s.hook for sites in out.values() for s in sites if not model.has_hook(s.hook)]
        if missing:
            raise UnsupportedArchitectureError(
                f"{head.name} of {model.name} cannot receive path patches: the bridge has no hook {missing[0]!r} on its "
                f"query/key/value projections ({spec.hf_class})")
        return out

    def pattern(self, model: "Model", spec: LayerSpec, cache: Any, heads: list["HeadRef"], batch: "TokenBatch",
                options: PatternOptions) -> Float[Tensor, "batch n q k"]:
        return cache[f"{spec.bridge_path}.hook_pattern"][:, [h.head for h in heads]].float()

    def mask_hooks(self, model: "Model", spec: LayerSpec, masks: dict["HeadRef", Any], stack: ExitStack,
                   options: MaskOptions) -> list[Hook]:
        component = model.component(spec.bridge_path)
        if _honours_pattern_edits(component):
            return [(f"{spec.bridge_path}.hook_pattern", _pattern_hook(masks, options.renormalize))]
        handle = unwrap(component).register_forward_hook(
            _delegated_attention_hook(spec, masks, options.renormalize), with_kwargs=True)
        stack.callback(handle.remove)
        return []
