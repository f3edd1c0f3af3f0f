"""Circuit discovery: head scans (exact, attribution, auto), G&A role scores, discovery of a
circuit with its ablation curve, and layer pruning."""

from gna_interp.circuits.discover import Circuit, ablation_curve, discover
from gna_interp.circuits.prune import prune_curve
from gna_interp.circuits.roles import RoleRule, role_scores
from gna_interp.circuits.scan import HeadScan, scan_heads

__all__ = ["Circuit", "HeadScan", "RoleRule", "ablation_curve", "discover", "prune_curve", "role_scores", "scan_heads"]
