"""gna_interp: find, score, visualise and intervene on Gather-and-Aggregate heads
in Transformers, state-space models and hybrids, on top of TransformerLens 4.x.

The names here read like the science::

    import gna_interp as gna
    m = gna.load_model("smollm2-135m")
    task = gna.KVRetrieval(n_pairs=10, n_samples=64)
    scan = gna.scan_heads(m, task, strategy="auto")
    with gna.ablate(m, scan.top(5)):
        print(gna.evaluate(m, task).accuracy)
"""

from gna_interp.circuits import (
    Circuit,
    CircuitComparison,
    DiscoverConfig,
    HeadScan,
    RoleRule,
    ScanConfig,
    ablation_curve,
    compare_circuits,
    discover,
    prune_curve,
    role_scores,
    scan_heads,
)
from gna_interp.errors import GnaError
from gna_interp.interventions import ablate, mask_pattern, skip_layers
from gna_interp.mixing import PatternOptions, PatternSet, patterns
from gna_interp.models import HeadRef, MaskOptions, MixerAdapter, Model, load_model, register_kind
from gna_interp.tasks import Evaluation, KVRetrieval, MultipleChoice, Sample, Task, evaluate, task_from_dict

__version__ = "0.1.0"
__all__ = ["Circuit", "CircuitComparison", "DiscoverConfig", "Evaluation", "GnaError", "HeadRef", "HeadScan", "KVRetrieval", "MaskOptions",
           "MixerAdapter", "Model", "MultipleChoice", "PatternOptions", "PatternSet", "RoleRule", "Sample",
           "ScanConfig", "Task", "ablate", "ablation_curve", "compare_circuits", "discover", "evaluate", "load_model", "mask_pattern",
           "patterns", "prune_curve", "register_kind", "role_scores", "scan_heads", "skip_layers",
           "task_from_dict"]
