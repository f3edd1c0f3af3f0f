"""Per-head patterns: softmax attention and (for SSM heads) implicit attention."""

from gna_interp.patterns.base import PROVIDERS, PatternProvider, PatternSet, patterns, register_provider

__all__ = ["PROVIDERS", "PatternProvider", "PatternSet", "patterns", "register_provider"]
