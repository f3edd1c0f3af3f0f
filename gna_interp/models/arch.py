"""Which token mixer each block has and how its heads are laid out.

Detection works on the bridge's blocks, not on architecture names, so any adapter that
TransformerLens 4.x ships (Llama, Mamba, Mamba-2, Bamba, Jamba, NemotronH, Zamba2, ...) is read
the same way: every registered mixer adapter (:mod:`gna_interp.models.mixer`) is asked, in
registration order, whether a bridged child of the block is its mixer -- a bridged ``attn``
component is attention; a mixer with a per-head ``A_log`` vector and ``dt_bias`` is Mamba-2 (SSD);
one with an ``A_log`` matrix, ``x_proj`` and ``dt_proj`` is Mamba-1 (S6). Any other token mixer
(RWKV time-mix, LFM2 short convolutions, gated delta nets, attention that the adapter does not
bridge) is reported with kind ``"unsupported"`` -- never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gna_interp.models.mixer import _REGISTRY, adapter, unwrap

if TYPE_CHECKING:
    from gna_interp.models.mixer import MixerAdapter

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
    """

    layer: int
    kind: str
    n_heads: int
    n_groups: int
    head_dim: int
    state_size: int
    bridge_path: str
    hf_class: str

    @property
    def supported(self) -> bool:
        return self.kind != UNSUPPORTED

    @property
    def adapter(self) -> "MixerAdapter":
        """The mixer adapter of this layer's kind."""
        return adapter(self.kind)


def _unsupported(layer: int, path: str, cls: str) -> LayerSpec:
    return LayerSpec(layer, UNSUPPORTED, 0, 0, 0, 0, path, cls)


def _classify(layer: int, name: str, component: Any) -> LayerSpec | None:
    for a in _REGISTRY.values():
        spec = a.detect(layer, name, component)
        if spec is not None:
            return spec
    if name.startswith(_NON_MIXER_PREFIXES):
        return None
    mod = unwrap(component)
    return _unsupported(layer, f"blocks.{layer}.{name}", type(mod).__name__)


def detect_layers(bridge: Any) -> list[LayerSpec]:
    """List the token mixers of every block of a TransformerBridge, in layer order."""
    specs: list[LayerSpec] = []
    for i, block in enumerate(bridge.blocks):
        found: list[LayerSpec] = []
        bridged_modules: set[int] = set()
        for name, child in block.named_children():
            if name.startswith(("hook_", "_original_component")):
                continue
            spec = _classify(i, name, child)
            if spec is None:
                continue
            found.append(spec)
            mod = unwrap(child)
            if mod is not child:
                bridged_modules.update(id(m) for m in mod.modules())
        # Attention inside the HF block that the adapter did not bridge (e.g. Zamba2's shared
        # transformer): visible in HF, invisible to hooks -> report it.
        hf_block = unwrap(block)
        if hf_block is not block:
            for sub_name, sub in hf_block.named_modules():
                if id(sub) in bridged_modules or not hasattr(sub, "q_proj"):
                    continue
                if any(id(m) in bridged_modules for m in sub.modules()):
                    continue
                found.append(_unsupported(i, f"blocks.{i}:{sub_name}", type(sub).__name__))
                bridged_modules.update(id(m) for m in sub.modules())
        if not found:
            found.append(_unsupported(i, f"blocks.{i}", type(block).__name__))
        specs.extend(found)
    return specs
