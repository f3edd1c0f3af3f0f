"""The names of a model's computational graph, in one place.

Nodes are the embeddings (``embed``), every head of every kind (``L16H0``, ``L17S3``, ``L35C3186``: a
:class:`~gna_interp.models.heads.HeadRef`), every MLP (``MLP5``) and the answer logits (``logits``). A node reads one
of :data:`RECEIVES`'s inputs; an edge's positions are one of :data:`POSITIONS`, the classes :data:`CLASSES`
partitioning a prompt's tokens. Every node name is parsed (:meth:`Node.parse`) and printed (:attr:`Node.name`)
here, and the order in which nodes write and read (:attr:`Node.order`) is decided here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.models.mixer import INPUTS

__all__ = ["CLASSES", "EMBED", "LOGITS", "NODE_KINDS", "POSITIONS", "RECEIVER_INPUTS", "RECEIVES", "Node",
           "mlp_name", "node_kind", "read_order", "receiver_nodes", "write_order"]

EMBED = "embed"
LOGITS = "logits"
_MLP = "MLP"
NODE_KINDS: tuple[str, ...] = ("head", "mlp", "embed", "logits")
RECEIVES: dict[str, tuple[str, ...]] = {"head": INPUTS, "mlp": ("mlp",), "logits": (LOGITS,), "embed": ()}
RECEIVER_INPUTS: tuple[str, ...] = (*INPUTS, "mlp", LOGITS)
CLASSES: tuple[str, ...] = ("items", "decision", "other")  # position classes: they partition a prompt's tokens
# every positions value an edge may carry: the classes, the summary tokens (path patching's finer class) and "all"
# (the logits, read at the decision)
POSITIONS: tuple[str, ...] = ("summary", "items", "decision", "other", "all")


def mlp_name(layer: int) -> str:
    """The node name of block ``layer``'s MLP."""
    return f"{_MLP}{layer}"


@dataclass(frozen=True)
class Node:
    """One node of the graph: its ``kind`` (one of :data:`NODE_KINDS`), its ``layer`` (-1 for the embeddings, None
    for the logits, which come after every layer) and, for a head, the ``head`` itself."""

    kind: str
    layer: int | None
    head: HeadRef | None = None

    @property
    def name(self) -> str:
        """``embed``, ``L16H0``, ``MLP5`` or ``logits``."""
        if self.kind == "head":
            assert self.head is not None
            return self.head.name
        return mlp_name(self.layer or 0) if self.kind == "mlp" else self.kind

    @property
    def order(self) -> float:
        """Where the node writes (or reads) in the forward pass: the embeddings first, a block's heads before its
        MLP, the logits last."""
        if self.kind == "logits":
            return math.inf
        return float(self.layer if self.layer is not None else 0) + (0.5 if self.kind == "mlp" else 0.0)

    @classmethod
    def parse(cls, name: object) -> "Node":
        """The node named ``name``; an :class:`InputError` (a :class:`~gna_interp.errors.HeadError` for a malformed
        head name) saying what is wrong."""
        if not isinstance(name, str):
            raise InputError(f"a node name is a string (embed, L3H1, MLP3, logits), got {type(name).__name__}")
        if name == EMBED:
            return cls("embed", -1)
        if name == LOGITS:
            return cls("logits", None)
        if name.startswith(_MLP):
            digits = name[len(_MLP):]
            if not digits.isdigit() or len(digits) > 9:
                raise InputError(f"malformed MLP node name {name[:40]!r}: expected MLP<layer>, e.g. MLP3")
            return cls("mlp", int(digits))
        head = HeadRef.parse(name)
        return cls("head", head.layer, head)


def node_kind(name: str) -> str:
    """The kind of the node named ``name`` (:data:`NODE_KINDS`)."""
    return Node.parse(name).kind


def write_order(sender: str) -> float:
    """When the sender ``sender`` writes (:attr:`Node.order`)."""
    return Node.parse(sender).order


def receiver_nodes(receiver: str) -> tuple[list[str], str]:
    """The nodes that read the receiver input named ``receiver`` and the input: ``L5H0+L5H1.k`` -> (``[L5H0,
    L5H1]``, ``k``) (a group's shared input), ``MLP5`` -> (``[MLP5]``, ``mlp``), ``logits`` -> (``[logits]``,
    ``logits``)."""
    if "." in receiver:
        heads, inp = receiver.rsplit(".", 1)
        return heads.split("+"), inp
    kind = node_kind(receiver)
    if kind not in ("mlp", "logits"):
        raise InputError(f"receiver input {receiver[:60]!r}: a head's input is named HEAD.INPUT, e.g. L5H2.q")
    return [receiver], RECEIVES[kind][0]


def read_order(receiver: str, n_layers: int) -> float:
    """When the receiver input ``receiver`` is read: a head input ``L5H0+L5H1.k`` in its layer, ``MLP5`` after
    its block's heads, ``logits`` after the last layer (``n_layers``)."""
    if receiver == LOGITS:
        return float(n_layers)
    return Node.parse(receiver_nodes(receiver)[0][0]).order
