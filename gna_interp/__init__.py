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

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for type checkers and the API docs
    from gna_interp.circuits import (
        Circuit,
        CircuitComparison,
        DiscoverConfig,
        Edge,
        HeadScan,
        PathEffects,
        RoleRule,
        ScanConfig,
        ablation_curve,
        compare_circuits,
        discover,
        edge_faithfulness,
        faithfulness,
        path_effects,
        prune_curve,
        reference_scan,
        role_scores,
        scan_heads,
    )
    from gna_interp.errors import GnaError
    from gna_interp.engine import PlanRunner
    from gna_interp.interventions import HeadAblation, LayerSkip, PatternMask, ablate, applied, mask_pattern, skip_layers
    from gna_interp.mixing import PatternOptions, PatternSet, patterns
    from gna_interp.models import HeadRef, MaskOptions, MixerAdapter, Model, load_model, register_kind
    from gna_interp.tasks import Evaluation, KVRetrieval, MultipleChoice, Sample, Task, evaluate, task_from_dict
    from gna_interp.tasks.choice import ChosenTask, TaskChoice, calibrate, choose_task

__version__ = "0.1.0"
__all__ = ["ChosenTask", "Circuit", "CircuitComparison", "DiscoverConfig", "Edge", "Evaluation", "GnaError", "HeadAblation", "HeadRef", "HeadScan", "KVRetrieval", "LayerSkip", "MaskOptions",
           "MixerAdapter", "Model", "MultipleChoice", "PathEffects", "PatternMask", "PatternOptions", "PatternSet", "PlanRunner",
           "RoleRule", "Sample",
           "ScanConfig", "Task", "TaskChoice", "ablate", "ablation_curve", "applied", "calibrate", "choose_task", "compare_circuits", "discover", "edge_faithfulness", "evaluate", "faithfulness", "load_model", "mask_pattern",
           "path_effects", "patterns", "prune_curve", "reference_scan", "register_kind", "role_scores", "scan_heads", "skip_layers",
           "task_from_dict"]

# Imported on first use (PEP 562): `gna` and `python -m gna_interp` import this package before any of our code
# runs, and importing torch here would make Ctrl-C during start-up print a traceback and `gna --help` slow.
_EXPORTS = {
    "Circuit": "gna_interp.circuits",
    "CircuitComparison": "gna_interp.circuits",
    "DiscoverConfig": "gna_interp.circuits",
    "Edge": "gna_interp.circuits",
    "ChosenTask": "gna_interp.tasks.choice",
    "TaskChoice": "gna_interp.tasks.choice",
    "calibrate": "gna_interp.tasks.choice",
    "choose_task": "gna_interp.tasks.choice",
    "HeadScan": "gna_interp.circuits",
    "PathEffects": "gna_interp.circuits",
    "path_effects": "gna_interp.circuits",
    "RoleRule": "gna_interp.circuits",
    "ScanConfig": "gna_interp.circuits",
    "ablation_curve": "gna_interp.circuits",
    "compare_circuits": "gna_interp.circuits",
    "discover": "gna_interp.circuits",
    "faithfulness": "gna_interp.circuits",
    "edge_faithfulness": "gna_interp.circuits",
    "prune_curve": "gna_interp.circuits",
    "reference_scan": "gna_interp.circuits",
    "role_scores": "gna_interp.circuits",
    "scan_heads": "gna_interp.circuits",
    "GnaError": "gna_interp.errors",
    "ablate": "gna_interp.interventions",
    "applied": "gna_interp.interventions",
    "HeadAblation": "gna_interp.interventions",
    "LayerSkip": "gna_interp.interventions",
    "PatternMask": "gna_interp.interventions",
    "PlanRunner": "gna_interp.engine",
    "mask_pattern": "gna_interp.interventions",
    "skip_layers": "gna_interp.interventions",
    "PatternOptions": "gna_interp.mixing",
    "PatternSet": "gna_interp.mixing",
    "patterns": "gna_interp.mixing",
    "HeadRef": "gna_interp.models",
    "MaskOptions": "gna_interp.models",
    "MixerAdapter": "gna_interp.models",
    "Model": "gna_interp.models",
    "load_model": "gna_interp.models",
    "register_kind": "gna_interp.models",
    "Evaluation": "gna_interp.tasks",
    "KVRetrieval": "gna_interp.tasks",
    "MultipleChoice": "gna_interp.tasks",
    "Sample": "gna_interp.tasks",
    "Task": "gna_interp.tasks",
    "evaluate": "gna_interp.tasks",
    "task_from_dict": "gna_interp.tasks",
}


# subpackages reachable as attributes without their own import (``gna.viz.score_heatmap``), imported on first use
_SUBPACKAGES = ("circuits", "engine", "experiments", "interventions", "mixing", "models", "report", "tasks", "viz",
                "zoo")


def __getattr__(name: str) -> Any:
    if name in _EXPORTS or name in _SUBPACKAGES:
        import importlib

        value = (importlib.import_module(f"gna_interp.{name}") if name in _SUBPACKAGES
                 else getattr(importlib.import_module(_EXPORTS[name]), name))
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gna_interp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_SUBPACKAGES})
