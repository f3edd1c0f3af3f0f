"""Model loading, the head abstraction, and one mixer adapter per head kind.

``models`` is the only package that touches the TransformerLens bridge (through :class:`Model`) and
the only one that knows what distinguishes head kinds (through the adapters registered here:
attention, Mamba-2 heads, Mamba-1 channels; more with :func:`register_kind`).
"""

from gna_interp.models.arch import LayerSpec, detect_layers
from gna_interp.models.attention import AttentionAdapter
from gna_interp.models.card import read_card
from gna_interp.models.handoff import Address, ablated_modules, ablation_hooks, edge_addresses, head_addresses
from gna_interp.models.heads import HeadRef, parse_heads
from gna_interp.models.registry import adapter, kinds, register_kind, unregister_kind
from gna_interp.models.mixer import HeadSite, MaskOptions, MixerAdapter, PatternOptions
from gna_interp.models.loading import convert_gguf, hub_reachable, load_model
from gna_interp.models.model import Model, TokenBatch, check_model
from gna_interp.models.spec import ALIASES, ResolvedSpec, cache_dir, resolve_spec, smollm2_gguf_path, zoo_dir, zoo_names
from gna_interp.models.ssm import Mamba1Adapter, Mamba2Adapter, SSMAdapter

for _adapter in (AttentionAdapter(), Mamba2Adapter(), Mamba1Adapter()):
    if _adapter.kind not in kinds():
        register_kind(_adapter)

__all__ = ["ALIASES", "Address", "AttentionAdapter", "HeadRef", "HeadSite", "LayerSpec", "Mamba1Adapter", "Mamba2Adapter", "MaskOptions",
           "MixerAdapter", "Model", "PatternOptions", "ResolvedSpec", "SSMAdapter", "TokenBatch", "ablated_modules", "ablation_hooks", "adapter",
           "cache_dir", "check_model", "convert_gguf", "detect_layers", "edge_addresses", "head_addresses", "hub_reachable", "kinds", "load_model", "parse_heads",
           "read_card", "register_kind", "resolve_spec", "smollm2_gguf_path", "unregister_kind", "zoo_dir",
           "zoo_names"]
