"""Per-head mixing matrices: softmax attention patterns and SSM implicit attention, and their sharpness.

:func:`patterns` reads them for any head kind from one forward (each kind's adapter knows how);
:mod:`gna_interp.mixing.sharpness` measures how concentrated they are.
"""

from gna_interp.models.mixer import PatternOptions
from gna_interp.mixing.pattern_set import PatternSet, patterns

__all__ = ["PatternOptions", "PatternSet", "patterns"]
