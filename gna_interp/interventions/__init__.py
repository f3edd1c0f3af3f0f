"""Interventions on a loaded model, each a context manager that restores the model on exit
(exceptions included) and leaves no hook behind. One module per intervention."""

from gna_interp.interventions.ablation import ablate
from gna_interp.interventions.layers import skip_layers
from gna_interp.interventions.masking import mask_pattern

__all__ = ["ablate", "mask_pattern", "skip_layers"]
