"""The self-contained HTML report of a saved circuit (`gna report DIR` rebuilds it, no model needed)."""

from gna_interp.report.build import build_report
from gna_interp.report.summary import circuit_summary

__all__ = ["build_report", "circuit_summary"]
