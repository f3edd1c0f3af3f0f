"""Model loading, the head abstraction and per-architecture knowledge."""

from gna_interp.models.arch import LayerSpec, detect_layers
from gna_interp.models.heads import HeadRef, parse_heads
from gna_interp.models.loading import ResolvedSpec, cache_dir, convert_gguf, load_model, resolve_spec
from gna_interp.models.model import Model, TokenBatch

__all__ = ["HeadRef", "LayerSpec", "Model", "ResolvedSpec", "TokenBatch", "cache_dir", "convert_gguf",
           "detect_layers", "load_model", "parse_heads", "resolve_spec"]
