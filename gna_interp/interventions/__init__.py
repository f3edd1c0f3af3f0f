"""Interventions on a loaded model, as values (:class:`Intervention`: :class:`HeadAblation`, :class:`LayerSkip`,
:class:`PatternMask`; serialisable, each saying which blocks it changes) and as context managers that restore the
model on exit (exceptions included) and leave no hook behind (:func:`ablate`, :func:`skip_layers`,
:func:`mask_pattern`, :func:`applied`). One module per intervention."""

from gna_interp.interventions.ablation import HeadAblation, ablate
from gna_interp.interventions.base import Intervention, applied, from_dict
from gna_interp.interventions.layers import LayerSkip, skip_layers
from gna_interp.interventions.masking import PatternMask, mask_pattern

__all__ = ["HeadAblation", "Intervention", "LayerSkip", "PatternMask", "ablate", "applied", "from_dict",
           "mask_pattern", "skip_layers"]
