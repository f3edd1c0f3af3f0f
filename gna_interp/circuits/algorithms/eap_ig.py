"""`eap_ig`: edge attribution patching with integrated gradients (Hanna, Pezzelle & Belinkov 2024)."""

from __future__ import annotations

from typing import Any

from gna_interp.circuits.algorithms.registry import algorithm
from gna_interp.circuits.algorithms.scores import GraphScores
from gna_interp.circuits.edges.edge_screen import screen_edges
from gna_interp.errors import OptionError
from gna_interp.interventions.ablation import AblationMethod
from gna_interp.models.model import Model
from gna_interp.tasks.base import Task


@algorithm("eap_ig")
def eap_ig(model: Model, task: Task, *, ig_steps: int = 5, method: AblationMethod = "zero", reference: Any = None,
           batch_size: int = 16, verify: int = 0) -> GraphScores:
    """``screen_edges(..., ig_steps=ig_steps)``'s scores: the gradient at each receiver input averaged over
    ``ig_steps`` points between the empty circuit and the intact model."""
    if isinstance(ig_steps, bool) or not isinstance(ig_steps, int) or ig_steps < 1:
        raise OptionError(f"eap_ig integrates over ig_steps >= 1 points, got {ig_steps!r} (eap is the 0-step form)")
    screen = screen_edges(model, task, method, reference, verify, batch_size, ig_steps=ig_steps)
    return GraphScores.of_screen(screen, ig_steps)
