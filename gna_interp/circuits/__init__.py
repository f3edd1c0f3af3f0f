"""Circuit discovery, in rooms by concept:

- :mod:`.scan`: head scans (exact, attribution, auto), G&A role scores, the control and specificity, interactions,
  delegation of roles between head kinds, sharding a scan over processes;
- :mod:`.edges`: the graph's edges measured -- path patching, causal roles, edge circuits, the whole-graph screen;
- :mod:`.algorithms`: every way of scoring the graph's nodes or edges, one file each behind one signature;
- :mod:`.search`: discovery of a circuit with its ablation curve and views, faithfulness and the smallest circuit,
  comparisons, layer pruning;
- :mod:`.hybrid`: retrieval-guided hybrid plans.
"""

from gna_interp.circuits.search.circuit import Circuit
from gna_interp.circuits.search.curve import CurveConfig, ablation_curve
from gna_interp.circuits.search.discovery import DiscoverConfig, discover
from gna_interp.circuits.search.sufficiency import Faithfulness, FaithfulnessConfig, edge_faithfulness, faithfulness
from gna_interp.circuits.search.comparison import CircuitComparison, compare_circuits
from gna_interp.circuits.hybrid import HybridPlan, plan_hybrid
from gna_interp.circuits.edges.paths import PathEffects, PathOptions, PathPatcher, path_effects
from gna_interp.models.graph import Edge
from gna_interp.circuits.search.prune import prune_curve
from gna_interp.circuits.scan.reference import reference_scan
from gna_interp.circuits.scan.roles import RoleRule, role_scores
from gna_interp.circuits.scan import ScanConfig, scan_heads
from gna_interp.circuits.scan.result import HeadScan
from gna_interp.circuits.search.views import CardViews, card_heads, card_views
from gna_interp.circuits.edges.whole_circuit import WholeCircuit

__all__ = ["CardViews", "Circuit", "CircuitComparison", "DiscoverConfig", "Edge", "HeadScan", "PathEffects", "PathOptions", "PathPatcher", "HybridPlan", "RoleRule", "ScanConfig", "ablation_curve", "reference_scan",
           "card_heads", "card_views", "compare_circuits", "discover", "path_effects", "plan_hybrid", "prune_curve", "role_scores", "scan_heads"]
from gna_interp.circuits.scan.interactions import Interactions, head_interactions
__all__ += ["WholeCircuit", "Interactions", "head_interactions", "Faithfulness", "FaithfulnessConfig", "edge_faithfulness", "faithfulness"]
from gna_interp.circuits.algorithms import GraphScores, score_graph  # noqa: E402
__all__ += ["GraphScores", "score_graph"]
