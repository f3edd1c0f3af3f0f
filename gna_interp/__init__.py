"""gna_interp: find, score, visualise and intervene on Gather-and-Aggregate heads
in Transformers, state-space models and hybrids, on top of TransformerLens 4.x."""

from gna_interp.errors import GnaError
from gna_interp.models import HeadRef, Model, load_model
from gna_interp.patterns import PatternSet, patterns

__version__ = "0.1.0"
__all__ = ["GnaError", "HeadRef", "Model", "PatternSet", "load_model", "patterns"]
