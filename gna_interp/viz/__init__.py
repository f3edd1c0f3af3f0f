"""Figures and HTML views. They take results and tensors, never load or run models -- except :func:`explore`,
the live Jupyter explorer, which scores a task with heads removed (through ``engine.replay``) as you click."""

from gna_interp.viz.attention import attention_heads, patterns_page
from gna_interp.viz.cards import ga_card
from gna_interp.viz.compare import compare_heads
from gna_interp.viz.curves import ablation_curve
from gna_interp.viz.explorer import explore
from gna_interp.viz.export import write_pngs
from gna_interp.viz.graph import circuit_graph, graph_figure
from gna_interp.viz.html import HTMLView, figure_div, page
from gna_interp.viz.interactions import interaction_heatmap
from gna_interp.viz.notebook import notebook_mode
from gna_interp.viz.scores import score_heatmap
from gna_interp.viz.stability import stability_plot

__all__ = ["HTMLView", "ablation_curve", "attention_heads", "circuit_graph", "compare_heads", "explore", "figure_div", "ga_card",
           "graph_figure", "interaction_heatmap", "notebook_mode", "page", "patterns_page", "score_heatmap",
           "stability_plot", "write_pngs"]
