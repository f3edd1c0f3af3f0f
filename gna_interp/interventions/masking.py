"""`mask_pattern(model, {head: mask})`: run the model with some heads' mixing patterns masked.

This is how the G&A paper keeps "only the Gather-and-Aggregate pattern" alive in a head.

- **Attention head** (``L1H2``): the post-softmax pattern of that head is multiplied by the mask;
  with ``renormalize=True`` each masked row is rescaled to sum to 1 again (rows whose mass is all
  masked stay zero). Where the bridge computes attention itself (Llama-style rotary attention,
  Bamba) this is an edit of ``blocks.{l}.attn.hook_pattern``. Where it delegates to the HF module
  and only reports the pattern afterwards (TransformerLens discards edits there, e.g. Jamba), a
  forward hook on the HF attention module adds ``o_proj((P' − P) V)`` to its output -- exact, the
  output being linear in the pattern -- and hands ``P'`` on to ``hook_pattern``. That path needs
  the HF module to return its weights (eager attention) and a single forward without a KV cache.
- **SSM head** (Mamba-2 ``L0S1``) or **channel / channel group** (Mamba-1 ``L0C5``, ``L0C8+4``):
  the unit's scan output is replaced by ``(M ⊙ mask) x + D x`` with ``M`` its exact implicit
  attention (:mod:`gna_interp.patterns.ssm`), computed in query blocks from the mixer's own input.
  Mamba-2: the head's ``head_dim`` slice of ``mixer.inner_norm.hook_in`` (before the gated norm);
  Mamba-1: the channel of ``mixer.out_proj.hook_in``, times the layer's gate ``silu(z)``. Every
  channel of a group gets the same mask. ``renormalize`` does not apply (``M`` is not a distribution).

A mask is a tensor broadcastable to ``[batch, q, k]`` in the coordinates of the forward pass that
runs inside the block (``[T, T]`` for every sequence, or ``[batch, T, T]``; with left padding,
position ``T-1`` is every prompt's last token). Entries above the diagonal have no effect.
A wrong shape raises :class:`~gna_interp.errors.InputError` when the forward reaches the head.

The hooks are temporary: they are removed when the block exits, exception or not, and the weights
are never touched. Not supported: a mixer run with TransformerLens's opt-in ``eager_scan`` path
(the HF mixer is then bypassed and its input is not captured; an error says so).
"""

from __future__ import annotations

import inspect
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator, Mapping

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from gna_interp.errors import GnaError, HeadError, InputError, UnsupportedArchitectureError
from gna_interp.models.arch import LayerSpec
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.patterns.ssm import DEFAULT_BLOCK_ELEMS, DEFAULT_QUERY_BLOCK, hf_mixer, mix, ssm_terms, unwrap

__all__ = ["mask_pattern"]

MaskLike = Float[Tensor, "*batch q k"]


def _prepare(mask: Any, head: HeadRef, batch: int, q: int, k: int, device: torch.device) -> Tensor:
    """The mask as float32 ``[batch|1, q, k]``; a clear error when it does not fit this forward."""
    m = torch.as_tensor(mask, device=device).float()
    ok = m.dim() in (2, 3) and tuple(m.shape[-2:]) == (q, k) and (m.dim() == 2 or m.shape[0] in (1, batch))
    if not ok:
        raise InputError(
            f"mask for {head.name} has shape {tuple(m.shape)} but this forward has {batch} sequence(s) of "
            f"{k} positions: pass [{q}, {k}] (same mask for every sequence) or [{batch}, {q}, {k}]")
    return m if m.dim() == 3 else m[None]


def _masked_rows(pattern: Tensor, heads: dict[HeadRef, Any], renormalize: bool) -> dict[HeadRef, Tensor]:
    """``pattern[:, h] * mask`` for each head (rows rescaled to sum 1 when ``renormalize``)."""
    b, _, q, k = pattern.shape
    rows: dict[HeadRef, Tensor] = {}
    for h, mask in heads.items():
        row = pattern[:, h.head] * _prepare(mask, h, b, q, k, pattern.device).to(pattern.dtype)
        if renormalize:
            total = row.sum(-1, keepdim=True)
            row = torch.where(total > 0, row / total.clamp_min(torch.finfo(row.dtype).tiny), row)
        rows[h] = row
    return rows


def _pattern_hook(heads: dict[HeadRef, Any], renormalize: bool) -> Callable[..., Tensor]:
    """Bridges that compute attention themselves (the pattern goes through ``hook_pattern``)."""

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

    if getattr(getattr(component, "original_component", None), "accepts_pattern_fn", False):
        return True
    return type(component).forward is not AttentionBridge.forward


def _delegated_attention_hook(spec: LayerSpec, heads: dict[HeadRef, Any],
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
        hidden, _ = _bind_args(module, args, kwargs)
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


def _bind_args(oc: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[Tensor, Tensor | None]:
    """``(hidden_states, attention_mask)`` from the arguments of an HF module's forward."""
    try:
        bound = inspect.signature(oc.forward).bind_partial(*args, **kwargs).arguments
    except TypeError:
        bound = dict(kwargs)
        if args:
            bound["hidden_states"] = args[0]
    hidden = bound.get("hidden_states", args[0] if args else None)
    mask = bound.get("attention_mask")
    if not isinstance(hidden, Tensor):
        raise GnaError(f"could not find the hidden states among the arguments of {type(oc).__name__}.forward")
    return hidden, mask if isinstance(mask, Tensor) else None


def _ssm_hooks(model: Model, spec: LayerSpec, heads: dict[HeadRef, Any], stack: ExitStack,
               block_elems: int, query_block: int | None) -> tuple[str, Callable[..., Tensor]]:
    """Register the input-capturing pre-hook on the HF mixer; return the (hook name, replacement hook)."""
    oc = hf_mixer(model, spec)
    target = f"{spec.bridge_path}.inner_norm.hook_in" if spec.kind == "ssm2" else f"{spec.bridge_path}.out_proj.hook_in"
    if target not in model.bridge.hook_dict:
        raise UnsupportedArchitectureError(
            f"cannot mask {spec.kind} heads of layer {spec.layer}: the bridge has no {target!r} hook "
            f"({type(oc).__name__}); masking needs the scan output before the gate/norm")
    captured: dict[str, Any] = {}

    def capture(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        captured["hidden"], captured["mask"] = _bind_args(module, args, kwargs)

    stack.callback(oc.register_forward_pre_hook(capture, with_kwargs=True).remove)
    stack.callback(captured.clear)
    units: list[int] = []
    unit_masks: list[Any] = []
    owners: list[HeadRef] = []
    for h, mask in heads.items():
        members = list(h.channels) if spec.kind == "ssm1" else [h.head]
        units.extend(members)
        unit_masks.extend([mask] * len(members))
        owners.extend([h] * len(members))

    def replace(value: Tensor, hook: Any) -> Tensor:
        if "hidden" not in captured:
            raise GnaError(
                f"mask_pattern: the input of {spec.bridge_path} was not captured before {target} fired "
                f"(is TransformerLens's eager_scan enabled on this mixer? disable it to mask SSM heads)")
        hidden, attn_mask = captured.pop("hidden"), captured.pop("mask")
        terms = ssm_terms(oc, hidden, attn_mask)
        b, T = terms.shape
        masks = [_prepare(m, owner, b, T, T, value.device) for m, owner in zip(unit_masks, owners)]
        y = mix(terms, units, masks, block_elems=block_elems, query_block=query_block)  # [b, T, n, P]
        out = value.clone()
        P = terms.x.shape[-1]
        for j, u in enumerate(units):
            if spec.kind == "ssm2":
                out[..., u * P:(u + 1) * P] = y[:, :, j].to(out.dtype)
            else:
                out[..., u] = (y[:, :, j, 0] * F.silu(terms.gate[..., u])).to(out.dtype)
        return out

    return target, replace


@contextmanager
def mask_pattern(model: Model, masks: Mapping[HeadRef | str, MaskLike], *, renormalize: bool = False,
                 block_elems: int = DEFAULT_BLOCK_ELEMS,
                 query_block: int | None = DEFAULT_QUERY_BLOCK) -> Iterator[Model]:
    """Inside the block, each head's pattern is multiplied by its mask; yields ``model``.

    ``masks`` maps heads (``HeadRef`` or names like ``L1H2``, ``L0S1``, ``L0C8+4``) to masks
    broadcastable to ``[batch, q, k]``. Attention: post-softmax pattern ``* mask`` (rows rescaled
    to sum 1 when ``renormalize``). SSM heads/channels: scan output ``(M ⊙ mask) x + D x``.
    All hooks are removed on exit, exceptions included.
    """
    by_layer: dict[tuple[int, str], dict[HeadRef, Any]] = {}
    for key, mask in masks.items():
        h = model.check_head(key)
        group = by_layer.setdefault((h.layer, h.kind), {})
        if h in group:
            raise HeadError(f"{h.name} is given twice in the masks")
        if h.kind == "ssm1":
            overlap = [o.name for o in group if set(o.channels) & set(h.channels)]
            if overlap:
                raise HeadError(f"{h.name} overlaps {overlap}: a channel can carry only one mask")
        group[h] = mask
    with ExitStack() as stack:
        fwd_hooks: list[tuple[str, Callable[..., Tensor]]] = []
        for (layer, kind), heads in sorted(by_layer.items()):
            spec = model.layer_spec(layer, kind)
            if kind == "attn":
                component = model.bridge.get_submodule(spec.bridge_path)
                if _honours_pattern_edits(component):
                    fwd_hooks.append((f"{spec.bridge_path}.hook_pattern", _pattern_hook(heads, renormalize)))
                else:
                    handle = unwrap(component).register_forward_hook(
                        _delegated_attention_hook(spec, heads, renormalize), with_kwargs=True)
                    stack.callback(handle.remove)
            else:
                fwd_hooks.append(_ssm_hooks(model, spec, heads, stack, block_elems, query_block))
        stack.enter_context(model.bridge.hooks(fwd_hooks=fwd_hooks))
        yield model
