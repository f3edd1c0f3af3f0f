"""The self-contained HTML report of a `gna scan` output folder (`gna report DIR` rebuilds it)."""

from gna_interp.report.build import REPORT_FILE, build_report, card_heads, task_from_circuit
from gna_interp.report.inputs import ReportInputs, load_inputs

__all__ = ["REPORT_FILE", "ReportInputs", "build_report", "card_heads", "load_inputs", "task_from_circuit"]
