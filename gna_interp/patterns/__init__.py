"""Per-head patterns: softmax attention and (for SSM heads) implicit attention."""

from gna_interp.patterns.base import PROVIDERS, PatternProvider, PatternSet, patterns, register_provider
from gna_interp.patterns import ssm  # noqa: F401  (registers the ssm2 / ssm1 providers)

__all__ = ["PROVIDERS", "PatternProvider", "PatternSet", "patterns", "register_provider"]
