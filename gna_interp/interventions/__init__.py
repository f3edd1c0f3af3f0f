"""Interventions on a loaded model, each a context manager that restores the model on exit.

One module per intervention; this file only re-exports (append your line).
"""

from gna_interp.interventions.masking import mask_pattern

__all__ = ["mask_pattern"]
