"""Interventions on a loaded model, as values (:class:`Intervention`: :class:`HeadAblation`, :class:`LayerSkip`,
:class:`PatternMask`, :class:`HeadScale`; serialisable, each saying which blocks it changes) and as context managers that restore the
model on exit (exceptions included) and leave no hook behind (:func:`ablate`, :func:`skip_layers`,
:func:`mask_pattern`, :func:`applied`). One module per intervention."""

from gna_interp.interventions.ablation import HeadAblation, ablate
from gna_interp.interventions.base import Intervention, applied, from_dict
from gna_interp.interventions.layers import LayerSkip, skip_layers
from gna_interp.interventions.masking import PatternMask, mask_pattern
from gna_interp.interventions.scaling import HeadScale, scale_heads

__all__ = ["HeadAblation", "HeadScale", "Intervention", "LayerSkip", "PatternMask", "ablate", "applied", "from_dict",
           "mask_pattern", "scale_heads", "skip_layers"]
