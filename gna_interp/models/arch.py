"""Which token mixer each block has and how its heads are laid out.

Detection works on the bridge's blocks, not on architecture names, so any adapter that
TransformerLens 4.x ships (Llama, Mamba, Mamba-2, Bamba, Jamba, NemotronH, Zamba2, ...) is read
the same way: every registered mixer adapter (:mod:`gna_interp.models.mixer`) is asked, in
registration order, whether a bridged child of the block is its mixer -- a bridged ``attn``
component is attention; a mixer with a per-head ``A_log`` vector and ``dt_bias`` is Mamba-2 (SSD);
one with an ``A_log`` matrix, ``x_proj`` and ``dt_proj`` is Mamba-1 (S6).

Before that, mixers the bridge leaves without the hooks of their kind are *reached*
(:mod:`gna_interp.models.reach`): Zamba2's shared attention block and the Mamba-2 mixer of its hybrid
layers become ``blocks.{l}.shared_attn`` / ``blocks.{l}.mixer``, Nemotron-H's pass-through
``blocks.{l}.mixer`` attention gains ``hook_pattern`` and ``o.hook_in``. A mixer whose weights also run
in other blocks (Zamba2's shared blocks) is listed at every depth, with ``LayerSpec.shared_by``.
Channel mixers in a mixer slot (Nemotron-H's MLP and MoE layers) are not token mixers and list no
heads. Any other token mixer (RWKV time-mix, LFM2 short convolutions, gated delta nets, attention
that cannot be reached) is reported with kind ``"unsupported"`` -- never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from gna_interp.errors import UnsupportedArchitectureError
from gna_interp.models.hf import unwrap
from gna_interp.models.registry import adapter, registered
from gna_interp.models.mixer import MixerAdapter
from gna_interp.models.reach import reach_mixers

UNSUPPORTED = "unsupported"

# Children of a bridged block that are not token mixers (unless an adapter claims them).
_NON_MIXER_PREFIXES = ("hook_", "_original_component", "ln", "norm", "pre_ln", "post_", "mlp",
                       "moe", "channel_mix", "feed_forward", "ffn", "experts", "router")


@dataclass(frozen=True)
class LayerSpec:
    """One token mixer of one block.

    Attributes:
        layer: block index.
        kind: a registered head kind (``attn``, ``ssm2``, ``ssm1``, ...) or ``unsupported``.
        n_heads: attention query heads / SSM heads / Mamba-1 channels (``d_inner``); 0 if unsupported.
        n_groups: attention KV heads (GQA) / SSM B,C groups; 1 for Mamba-1.
        head_dim: channels per head (attention ``d_head``, Mamba-2 ``head_dim``, 1 for Mamba-1).
        state_size: SSM state size N (0 for attention).
        bridge_path: the bridge component, e.g. ``blocks.3.attn`` or ``blocks.3.mixer``.
        hf_class: class name of the Hugging Face module behind it.
        shared_by: the layers whose mixer of this kind runs the very same weights, this one included
            (Zamba2's shared attention blocks); empty when the weights are this layer's own.
    """

    layer: int
    kind: str
    n_heads: int
    n_groups: int
    head_dim: int
    state_size: int
    bridge_path: str
    hf_class: str
    shared_by: tuple[int, ...] = ()

    @property
    def supported(self) -> bool:
        return self.kind != UNSUPPORTED

    @property
    def adapter(self) -> MixerAdapter:
        """The mixer adapter of this layer's kind."""
        return adapter(self.kind)


def _unsupported(layer: int, path: str, cls: str) -> LayerSpec:
    return LayerSpec(layer, UNSUPPORTED, 0, 0, 0, 0, path, cls)


# Names that only token mixers have (attention projections, SSM parameters, recurrences).
_TOKEN_MIXING = {"q_proj", "k_proj", "qkv_proj", "query_key_value", "c_attn", "Wqkv", "A_log", "conv1d",
                 "time_mix", "time_mixer", "attention", "self_attn", "recurrence"}
_CHANNEL_MIXING = {"down_proj", "experts", "fc2", "w2", "dense_4h_to_h", "output_linear"}  # output_linear: Granite MoE


def is_channel_mixer(module: torch.nn.Module) -> bool:
    """Whether a Hugging Face module only mixes channels within a position (an MLP or a mixture of
    experts, or a bare linear projection): it has a down projection or experts and nothing that mixes
    positions (no attention projection, SSM parameter or convolution)."""
    if type(module) is torch.nn.Linear:  # a bare projection in a block (Gemma-4's per-layer input gate)
        return True
    names = {n.rsplit(".", 1)[-1] for n, _ in module.named_modules()}
    names |= {n.rsplit(".", 1)[-1] for n, _ in module.named_parameters()}
    if names & _TOKEN_MIXING or any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in module.modules()):
        return False
    return bool(names & _CHANNEL_MIXING)


def _classify(layer: int, name: str, component: Any) -> LayerSpec | None:
    for a in registered():
        spec = a.detect(layer, name, component)
        if spec is not None:
            return spec
    if name.startswith(_NON_MIXER_PREFIXES) or is_channel_mixer(unwrap(component)):
        return None
    mod = unwrap(component)
    return _unsupported(layer, f"blocks.{layer}.{name}", type(mod).__name__)


def _mark_shared(specs: list[LayerSpec], bridge: Any) -> list[LayerSpec]:
    """Fill ``shared_by`` for mixers whose Hugging Face modules hold the very same parameters."""
    groups: dict[tuple[str, frozenset[int]], list[int]] = {}
    keys: list[tuple[str, frozenset[int]] | None] = []
    for s in specs:
        key = None
        if s.supported:
            params = frozenset(id(p) for p in unwrap(bridge.get_submodule(s.bridge_path)).parameters())
            key = (s.kind, params) if params else None
        keys.append(key)
        if key is not None:
            groups.setdefault(key, []).append(s.layer)
    return [replace(s, shared_by=tuple(groups[k])) if k is not None and len(groups[k]) > 1 else s
            for s, k in zip(specs, keys)]


def detect_layers(bridge: Any) -> list[LayerSpec]:
    """List the token mixers of every block of a TransformerBridge, in layer order.

    Mixers the bridge leaves without the hooks of their kind are reached first (hook points added to
    the bridge, once: see :mod:`gna_interp.models.reach`).
    """
    if not hasattr(bridge, "blocks"):
        raise UnsupportedArchitectureError(
            f"TransformerLens's bridge for {type(getattr(bridge, 'original_model', bridge)).__name__} exposes no "
            f"blocks (bridge.blocks), so gna_interp finds no layers or heads in it")
    reach_mixers(bridge, registered())
    specs: list[LayerSpec] = []
    for i, block in enumerate(bridge.blocks):
        found: list[LayerSpec] = []
        bridged_modules: set[int] = set()
        channel_only = False
        for name, child in block.named_children():
            if name.startswith(("hook_", "_original_component")):
                continue
            spec = _classify(i, name, child)
            if spec is None:  # a channel mixer in the block's mixer slot (Nemotron-H MLP/MoE layers)?
                channel_only = channel_only or (not name.startswith(_NON_MIXER_PREFIXES)
                                                and is_channel_mixer(unwrap(child)))
                continue
            found.append(spec)
            mod = unwrap(child)
            if mod is not child:
                bridged_modules.update(id(m) for m in mod.modules())
        # Attention or SSM mixers inside the HF block that neither the bridge nor models/reach.py could
        # hook: visible in HF, invisible to hooks -> report them.
        hf_block = unwrap(block)
        if hf_block is not block:
            for sub_name, sub in hf_block.named_modules():
                if id(sub) in bridged_modules or not (hasattr(sub, "q_proj") or hasattr(sub, "A_log")):
                    continue
                if any(id(m) in bridged_modules for m in sub.modules()):
                    continue
                found.append(_unsupported(i, f"blocks.{i}:{sub_name}", type(sub).__name__))
                bridged_modules.update(id(m) for m in sub.modules())
        if not found and not channel_only:
            found.append(_unsupported(i, f"blocks.{i}", type(block).__name__))
        specs.extend(found)
    return _mark_shared(specs, bridge)
