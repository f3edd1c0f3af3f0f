"""Per-architecture knowledge: which token mixer each block has and how its heads are laid out.

Detection works on the bridge's blocks, not on architecture names, so any adapter that
TransformerLens 4.x ships (Llama, Mamba, Mamba-2, Bamba, Jamba, NemotronH, Zamba2, ...) is read
the same way: a bridged ``attn`` component is an attention mixer; a mixer whose Hugging Face
module has a per-head ``A_log`` vector and ``dt_bias`` is a Mamba-2 (SSD) mixer; one with an
``A_log`` matrix, ``x_proj`` and ``dt_proj`` is a Mamba-1 (S6) mixer. Any other token mixer
(RWKV time-mix, LFM2 short convolutions, gated delta nets, attention that the adapter does not
bridge) is reported with kind ``"unsupported"`` -- never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

MixerKind = Literal["attn", "ssm2", "ssm1", "unsupported"]

# Children of a bridged block that are not token mixers.
_NON_MIXER_PREFIXES = ("hook_", "_original_component", "ln", "norm", "pre_ln", "post_", "mlp",
                       "moe", "channel_mix", "feed_forward", "ffn", "experts", "router")


@dataclass(frozen=True)
class LayerSpec:
    """One token mixer of one block.

    Attributes:
        layer: block index.
        kind: ``attn``, ``ssm2``, ``ssm1`` or ``unsupported``.
        n_heads: attention query heads / SSM heads / Mamba-1 channels (``d_inner``); 0 if unsupported.
        n_groups: attention KV heads (GQA) / SSM B,C groups; 1 for Mamba-1.
        head_dim: channels per head (attention ``d_head``, Mamba-2 ``head_dim``, 1 for Mamba-1).
        state_size: SSM state size N (0 for attention).
        bridge_path: the bridge component, e.g. ``blocks.3.attn`` or ``blocks.3.mixer``.
        hf_class: class name of the Hugging Face module behind it.
    """

    layer: int
    kind: MixerKind
    n_heads: int
    n_groups: int
    head_dim: int
    state_size: int
    bridge_path: str
    hf_class: str

    @property
    def hook_prefix(self) -> str:
        return self.bridge_path


def _hf_module(component: Any) -> torch.nn.Module | None:
    return getattr(component, "original_component", None) or getattr(component, "_original_component", None)


def _classify(layer: int, name: str, component: Any) -> LayerSpec:
    mod = _hf_module(component)
    cls = type(mod).__name__ if mod is not None else type(component).__name__
    path = f"blocks.{layer}.{name}"
    a_log = getattr(mod, "A_log", None) if mod is not None else None
    if name == "attn" and mod is not None:
        cfg = getattr(mod, "config", None)
        n_heads = getattr(mod, "num_heads", None) or getattr(cfg, "num_attention_heads", None)
        n_kv = getattr(mod, "num_key_value_heads", None) or getattr(cfg, "num_key_value_heads", None) or n_heads
        head_dim = getattr(mod, "head_dim", None) or (getattr(cfg, "hidden_size") // n_heads)
        return LayerSpec(layer, "attn", int(n_heads), int(n_kv), int(head_dim), 0, path, cls)
    if isinstance(a_log, torch.Tensor) and a_log.dim() == 1 and hasattr(mod, "dt_bias"):
        return LayerSpec(layer, "ssm2", int(mod.num_heads), int(mod.n_groups), int(mod.head_dim),
                         int(mod.ssm_state_size), path, cls)
    if isinstance(a_log, torch.Tensor) and a_log.dim() == 2 and hasattr(mod, "x_proj") and hasattr(mod, "dt_proj"):
        return LayerSpec(layer, "ssm1", int(a_log.shape[0]), 1, 1, int(a_log.shape[1]), path, cls)
    return LayerSpec(layer, "unsupported", 0, 0, 0, 0, path, cls)


def detect_layers(bridge: Any) -> list[LayerSpec]:
    """List the token mixers of every block of a TransformerBridge, in layer order."""
    specs: list[LayerSpec] = []
    for i, block in enumerate(bridge.blocks):
        found: list[LayerSpec] = []
        bridged_modules: set[int] = set()
        for name, child in block.named_children():
            if name.startswith(_NON_MIXER_PREFIXES):
                continue
            spec = _classify(i, name, child)
            found.append(spec)
            mod = _hf_module(child)
            if mod is not None:
                bridged_modules.update(id(m) for m in mod.modules())
        # Attention inside the HF block that the adapter did not bridge (e.g. Zamba2's shared
        # transformer): visible in HF, invisible to hooks -> report it.
        hf_block = _hf_module(block)
        if hf_block is not None:
            for sub_name, sub in hf_block.named_modules():
                if id(sub) in bridged_modules or not hasattr(sub, "q_proj"):
                    continue
                if any(id(m) in bridged_modules for m in sub.modules()):
                    continue
                found.append(LayerSpec(i, "unsupported", 0, 0, 0, 0, f"blocks.{i}:{sub_name}", type(sub).__name__))
                bridged_modules.update(id(m) for m in sub.modules())
        if not found:
            found.append(LayerSpec(i, "unsupported", 0, 0, 0, 0, f"blocks.{i}", type(block).__name__))
        specs.extend(found)
    return specs
