"""The self-contained HTML report of a saved circuit (`gna report DIR` rebuilds it, no model needed)."""

from gna_interp.report.build import REPORT_FILE, build_report

__all__ = ["REPORT_FILE", "build_report"]
