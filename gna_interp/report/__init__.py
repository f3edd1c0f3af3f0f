"""The self-contained HTML report of a saved circuit (`gna report DIR` rebuilds it, no model needed)."""

from gna_interp.report.build import REPORT_FILE, SUMMARY_FILE, build_report
from gna_interp.report.summary import circuit_summary

__all__ = ["REPORT_FILE", "SUMMARY_FILE", "build_report", "circuit_summary"]
