"""The SSM head kinds: Mamba-2 (SSD) heads (``ssm2``, letter ``S``) and Mamba-1 (S6) channels (``ssm1``, letter ``C``).

- **Output**: ``blocks.{l}.mixer.out_proj.hook_in`` (``[batch, pos, d_inner]``): a Mamba-2 head owns its
  ``head_dim`` channels, a Mamba-1 unit its channel (or ``width`` channels for a group ``L3C128+16``).
  Zeroing them equals zeroing those columns of ``out_proj`` (the official procedure).
- **Pattern**: the exact implicit attention (:mod:`gna_interp.models.ssm_kernel`), computed from the
  mixer's input ``blocks.{l}.mixer.hook_in``; a Mamba-1 group's pattern is the mean of its channels'.
- **Masking**: the unit's scan output is replaced by ``(M ⊙ mask) x + D x`` with ``M`` its exact implicit
  attention, computed in query blocks from the mixer's own input (captured by a pre-hook on the HF mixer).
  Mamba-2: the head's ``head_dim`` slice of ``mixer.inner_norm.hook_in`` (before the gated norm), or of
  ``mixer.out_proj.hook_in`` times ``silu(z)`` where the mixer has no gated norm (Falcon-H1 with
  ``mamba_rms_norm=False``, the released checkpoints); Mamba-1: the channel of ``mixer.out_proj.hook_in``,
  times the layer's gate ``silu(z)``. Every channel of a group gets the same mask. Not supported: a
  mixer run with TransformerLens's opt-in ``eager_scan`` path (its input is then not captured; an
  error says so).
- **Reached mixers**: a Mamba mixer the bridge does not wrap (the Mamba-2 mixer of a Zamba2 hybrid
  layer) gets ``hook_in``, ``hook_out``, ``in_proj.*``, ``out_proj.*`` and ``inner_norm.*`` hook points
  from :mod:`gna_interp.models.reach` at ``blocks.{l}.mixer``, so everything above applies unchanged.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from gna_interp.errors import GnaError, UnsupportedArchitectureError
from gna_interp.models.arch import LayerSpec
from gna_interp.models.hf import bind_args, unwrap
from gna_interp.models.mixer import Hook, MaskOptions, MixerAdapter, PatternOptions, prepare_mask, shared_note
from gna_interp.models.mixer import InputSite, ReachPlan
from gna_interp.models.ssm_kernel import SSMTerms, implicit_attention, is_ssm1, is_ssm2, mix, ssm_terms

from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model, TokenBatch


def _gated_norm(oc: Any) -> bool:
    """Whether a Mamba-2 mixer passes its scan output through a gated norm module (``norm``); Falcon-H1
    with ``mamba_rms_norm=False`` gates with ``silu(z)`` instead and never calls its ``nn.Identity`` norm."""
    norm = getattr(oc, "norm", None)
    return (isinstance(norm, torch.nn.Module) and not isinstance(unwrap(norm), torch.nn.Identity)
            and getattr(oc, "mamba_rms_norm", True) is not False)


class SSMAdapter(MixerAdapter):
    """What Mamba-1 and Mamba-2 mixers share: output at ``out_proj``, patterns by the exact kernel."""

    scan_hook: str  # where masking writes the masked scan output, relative to the mixer

    def scan_target(self, oc: Any) -> tuple[str, bool]:
        """Where masking writes a unit's scan output for HF mixer ``oc``: the hook relative to the mixer
        and whether the value there is gated (``y * silu(z)``)."""
        return self.scan_hook, False

    def reach_plan(self, module: torch.nn.Module) -> ReachPlan | None:
        """A Mamba mixer of this kind: ``hook_in``, ``out_proj.*`` (and ``in_proj.*``, the gated norm's
        ``inner_norm.*``) are reached unless the bridge already wraps it with them."""
        if self.detect_module(module) is None or not isinstance(getattr(module, "out_proj", None), torch.nn.Module):
            return None
        subs = {"out_proj": "out_proj"}
        if isinstance(getattr(module, "in_proj", None), torch.nn.Module):
            subs["in_proj"] = "in_proj"
        if self.scan_hook.startswith("inner_norm.") and _gated_norm(module):  # Mamba-2's gated norm
            subs["inner_norm"] = "norm"
        required = ("hook_in", "out_proj.hook_in") + (("inner_norm.hook_in",) if "inner_norm" in subs else ())
        return ReachPlan("mixer", subs, required=required)

    def detect_module(self, mod: Any) -> tuple[int, int, int, int] | None:
        """``(units, groups, head_dim, state size)`` if the HF module is this kind's mixer, else None."""
        raise NotImplementedError

    def detect(self, layer: int, name: str, component: Any) -> LayerSpec | None:
        mod = unwrap(component)
        layout = None if mod is component else self.detect_module(mod)
        if layout is None:
            return None
        return LayerSpec(layer, self.kind, *layout, f"blocks.{layer}.{name}", type(mod).__name__)

    def output_hook(self, spec: LayerSpec) -> str:
        return f"{spec.bridge_path}.out_proj.hook_in"

    def pattern_hooks(self, spec: LayerSpec) -> list[str]:
        return [f"{spec.bridge_path}.hook_in"]

    def terms(self, model: "Model", spec: LayerSpec, hidden_states: Float[Tensor, "batch pos d_model"],
              attention_mask: Tensor | None = None) -> SSMTerms:
        """The scan inputs (x, Δ, A, B, C, D, gate) of layer ``spec`` recomputed from its mixer input."""
        return ssm_terms(model.hf_module(spec.bridge_path), hidden_states, attention_mask)

    def pattern(self, model: "Model", spec: LayerSpec, cache: Any, heads: list["HeadRef"], batch: "TokenBatch",
                options: PatternOptions) -> Float[Tensor, "batch n q k"]:
        mask = batch.attention_mask if batch.padded else None
        terms = self.terms(model, spec, cache[f"{spec.bridge_path}.hook_in"], mask)
        units: list[int | list[int]] = [list(h.channels) if h.width > 1 else h.head for h in heads]
        return implicit_attention(terms, units, form=options.form, group_reduce=options.group_reduce,
                                  block_elems=options.block_elems, query_block=options.query_block)

    def write_scan(self, out: Tensor, terms: SSMTerms, unit: int, y: Tensor, gated: bool) -> None:
        """Write unit ``unit``'s scan output ``y`` (``[b, T, head_dim]``) into the tensor at the scan target,
        times ``silu(z)`` of its channels when ``gated``."""
        P = terms.x.shape[-1]
        cols = slice(unit * P, (unit + 1) * P)
        val = y * F.silu(terms.gate[..., cols]) if gated else y
        out[..., cols] = val.to(out.dtype)

    def mask_hooks(self, model: "Model", spec: LayerSpec, masks: dict["HeadRef", Any], stack: ExitStack,
                   options: MaskOptions) -> list[Hook]:
        oc = model.hf_module(spec.bridge_path)
        rel, gated = self.scan_target(oc)
        target = f"{spec.bridge_path}.{rel}"
        if not model.has_hook(target):
            raise UnsupportedArchitectureError(
                f"cannot mask {spec.kind} heads of layer {spec.layer}: the bridge has no {target!r} hook "
                f"({type(oc).__name__}); masking needs the scan output before the gate/norm")
        captured: dict[str, Any] = {}

        def capture(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            captured["hidden"], captured["mask"] = bind_args(module, args, kwargs)

        stack.callback(oc.register_forward_pre_hook(capture, with_kwargs=True).remove)
        stack.callback(captured.clear)
        units: list[int] = []
        unit_masks: list[Any] = []
        owners: list[HeadRef] = []
        for h, mask in masks.items():
            units.extend(h.channels)
            unit_masks.extend([mask] * h.width)
            owners.extend([h] * h.width)

        def replace(value: Tensor, hook: Any) -> Tensor:
            if "hidden" not in captured:
                raise GnaError(
                    f"mask_pattern: the input of {spec.bridge_path} was not captured before {target} fired "
                    f"(is TransformerLens's eager_scan enabled on this mixer? disable it to mask SSM heads)")
            hidden, attn_mask = captured.pop("hidden"), captured.pop("mask")
            terms = ssm_terms(oc, hidden, attn_mask)
            b, T = terms.shape
            prepared = [prepare_mask(m, owner, b, T, T, value.device) for m, owner in zip(unit_masks, owners)]
            y = mix(terms, units, prepared, block_elems=options.block_elems, query_block=options.query_block)
            out = value.clone()
            for j, u in enumerate(units):
                self.write_scan(out, terms, u, y[:, :, j], gated)
            return out

        return [(target, replace)]


class Mamba2Adapter(SSMAdapter):
    """Heads of a Mamba-2 (SSD) mixer: ``head_dim`` channels sharing one scalar decay ``A_h``."""

    kind = "ssm2"
    letter = "S"
    title = "Mamba-2 (SSM) heads"
    label = "Mamba-2 SSM head"
    unit = "SSM heads"
    axis = "SSM head"
    scan_hook = "inner_norm.hook_in"

    def detect_module(self, mod: Any) -> tuple[int, int, int, int] | None:
        if not is_ssm2(mod):
            return None
        return int(mod.num_heads), int(mod.n_groups), int(mod.head_dim), int(mod.ssm_state_size)

    def scan_target(self, oc: Any) -> tuple[str, bool]:
        return (self.scan_hook, False) if _gated_norm(oc) else ("out_proj.hook_in", True)

    def receiver_inputs(self, model: "Model", spec: LayerSpec, head: "HeadRef") -> dict[str, list[InputSite]]:
        """Channels of ``in_proj.hook_out`` (laid out ``[gate | x | B | C | Δ]`` behind any extra MLP part):
        ``v`` the head's ``x`` channels (value-like), ``k`` its group's ``B`` (key-like), ``q`` its group's ``C``
        (query-like), ``other`` its gate ``z`` channels and its ``Δ``. The causal convolution runs after
        ``in_proj``, so a change at one position reaches the next ``conv_kernel - 1`` positions of that input."""
        hook = f"{spec.bridge_path}.in_proj.hook_out"
        if not model.has_hook(hook):
            raise UnsupportedArchitectureError(f"{head.name} of {model.name} cannot receive path patches: the bridge "
                                               f"has no hook {hook!r}")
        nh, hd, ng, ds = spec.n_heads, spec.head_dim, spec.n_groups, spec.state_size
        inner = nh * hd
        width = int(unwrap(model.hf_module(spec.bridge_path).in_proj).out_features)
        off = width - (2 * inner + 2 * ng * ds + nh)  # Mamba-2's optional MLP part (2 * d_mlp) comes first
        h, g = head.head, head.head // (nh // ng)
        x0, b0 = off + inner, off + 2 * inner
        c0, dt0 = b0 + ng * ds, b0 + 2 * ng * ds

        def at(a: int, n: int) -> InputSite:
            return InputSite(hook, a, a + n)

        return {"q": [at(c0 + g * ds, ds)], "k": [at(b0 + g * ds, ds)], "v": [at(x0 + h * hd, hd)],
                "other": [at(off + h * hd, hd), at(dt0 + h, 1)]}

    def receiver_isolation(self, model: "Model", spec: LayerSpec, head: "HeadRef") -> InputSite | None:
        """The gated norm normalises the heads' scan outputs together: ``inner_norm.hook_in`` (before it) keeps
        only this head's channels changed."""
        if not _gated_norm(model.hf_module(spec.bridge_path)):
            return None
        d = spec.head_dim
        return InputSite(f"{spec.bridge_path}.{self.scan_hook}", head.head * d, (head.head + 1) * d)

    def describe(self, spec: LayerSpec) -> str:
        return (f"Mamba-2 heads: {spec.n_heads} per layer, head_dim {spec.head_dim}, groups {spec.n_groups}, "
                f"state {spec.state_size}" + shared_note(spec))


class Mamba1Adapter(SSMAdapter):
    """Channels of a Mamba-1 (S6) mixer (``d_inner`` per layer, each with its own ``A_d ∈ R^N``);
    consecutive channels can be grouped into one unit."""

    kind = "ssm1"
    letter = "C"
    title = "Mamba-1 channels"
    label = "Mamba-1 channel"
    unit = "channels"
    axis = "channel (group start)"
    groupable = True
    default_groups = 16
    scan_hook = "out_proj.hook_in"

    def detect_module(self, mod: Any) -> tuple[int, int, int, int] | None:
        if not is_ssm1(mod):
            return None
        return int(mod.A_log.shape[0]), 1, 1, int(mod.A_log.shape[1])

    def scan_target(self, oc: Any) -> tuple[str, bool]:
        return self.scan_hook, True

    def describe(self, spec: LayerSpec) -> str:
        return f"Mamba-1 channels: {spec.n_heads} per layer, state {spec.state_size}" + shared_note(spec)


def layer_terms(model: "Model", spec: LayerSpec, hidden_states: Float[Tensor, "batch pos d_model"],
                attention_mask: Tensor | None = None) -> SSMTerms:
    """The scan inputs of SSM layer ``spec`` of ``model`` recomputed from its mixer input
    (``blocks.{l}.mixer.hook_in``); see :func:`~gna_interp.models.ssm_kernel.ssm_terms`."""
    if not isinstance(spec.adapter, SSMAdapter):
        raise UnsupportedArchitectureError(f"layer {spec.layer} mixer {spec.bridge_path} is {spec.kind!r}, "
                                           f"not an SSM layer")
    return spec.adapter.terms(model, spec, hidden_states, attention_mask)
