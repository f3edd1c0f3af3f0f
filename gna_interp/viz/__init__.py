"""Figures and HTML views. They take results and tensors, never load or run models."""

from gna_interp.viz.attention import attention_heads, patterns_page
from gna_interp.viz.html import page

__all__ = ["attention_heads", "page", "patterns_page"]
