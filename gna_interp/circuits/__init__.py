"""Circuit discovery: head scans (exact, attribution, auto), G&A role scores, discovery of a circuit
with its ablation curve and report views, layer pruning, and retrieval-guided hybrid plans."""

from gna_interp.circuits.circuit import Circuit
from gna_interp.circuits.curve import CurveConfig, ablation_curve
from gna_interp.circuits.discovery import DiscoverConfig, discover
from gna_interp.circuits.sufficiency import Faithfulness, FaithfulnessConfig, edge_faithfulness, faithfulness
from gna_interp.circuits.comparison import CircuitComparison, compare_circuits
from gna_interp.circuits.hybrid import HybridPlan, plan_hybrid
from gna_interp.circuits.paths import Edge, PathEffects, PathOptions, PathPatcher, path_effects
from gna_interp.circuits.prune import prune_curve
from gna_interp.circuits.reference import reference_scan
from gna_interp.circuits.roles import RoleRule, role_scores
from gna_interp.circuits.scan import ScanConfig, scan_heads
from gna_interp.circuits.scan.result import HeadScan
from gna_interp.circuits.views import CardViews, card_heads, card_views
from gna_interp.circuits.whole_circuit import WholeCircuit

__all__ = ["CardViews", "Circuit", "CircuitComparison", "DiscoverConfig", "Edge", "HeadScan", "PathEffects", "PathOptions", "PathPatcher", "HybridPlan", "RoleRule", "ScanConfig", "ablation_curve", "reference_scan",
           "card_heads", "card_views", "compare_circuits", "discover", "path_effects", "plan_hybrid", "prune_curve", "role_scores", "scan_heads"]
from gna_interp.circuits.interactions import Interactions, head_interactions
__all__ += ["WholeCircuit", "Interactions", "head_interactions", "Faithfulness", "FaithfulnessConfig", "edge_faithfulness", "faithfulness"]
from gna_interp.circuits.algorithms import GraphScores, score_graph  # noqa: E402
__all__ += ["GraphScores", "score_graph"]
