"""The names of a model's computational graph, in one place.

Nodes are the embeddings (``embed``), every head of every kind (``L16H0``, ``L17S3``, ``L35C3186``: a
:class:`~gna_interp.models.heads.HeadRef`), every MLP (``MLP5``) and the answer logits (``logits``). A node reads one
of :data:`RECEIVES`'s inputs; an edge's positions are one of :data:`POSITIONS`, the classes :data:`CLASSES`
partitioning a prompt's tokens. Every node name is parsed (:meth:`Node.parse`) and printed (:attr:`Node.name`)
here, and the order in which nodes write and read (:attr:`Node.order`) is decided here. :class:`Edge` is the one
edge type: a sender node into one input of a receiver (a head, the heads sharing a KV or B/C group's input, an MLP or
the logits) at one position class -- what path patching measures, what an edge circuit keeps, what the screen
scores and what a whole circuit stores.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from typing import Any

from gna_interp.errors import HeadError, InputError, UnsupportedArchitectureError
from gna_interp.models.heads import HeadRef
from gna_interp.models.mixer import INPUTS, InputSite

__all__ = ["CLASSES", "EMBED", "LOGITS", "NODE_KINDS", "POSITIONS", "RECEIVER_INPUTS", "RECEIVES", "Edge", "Node",
           "ReceiverInput", "mlp_name", "node_kind", "read_order", "receiver_inputs", "receiver_nodes", "sender_names",
           "write_order"]

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
_GROUP = re.compile(r"\+(?=L)")  # between the heads of a shared input's name


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
    return _parsed(name).kind


def write_order(sender: str) -> float:
    """When the sender ``sender`` writes (:attr:`Node.order`)."""
    return _parsed(sender).order


def receiver_nodes(receiver: str) -> tuple[list[str], str]:
    """The nodes that read the receiver input named ``receiver`` and the input: ``L5H0+L5H1.k`` -> (``[L5H0,
    L5H1]``, ``k``) (a group's shared input), ``MLP5`` -> (``[MLP5]``, ``mlp``), ``logits`` -> (``[logits]``,
    ``logits``)."""
    if "." in receiver:
        heads, inp = receiver.rsplit(".", 1)
        return _GROUP.split(heads), inp
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


@functools.lru_cache(maxsize=1 << 16)
def _parsed(name: str) -> Node:
    """:meth:`Node.parse`, once per name (an edge list names a few hundred nodes hundreds of thousands of times)."""
    return Node.parse(name)


def _shown(name: str, n: int) -> str:
    """The first ``n`` characters of ``name`` for an error message, line breaks and other unprintable characters
    escaped (a message is one line)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in name[:n])


def _node_name(value: Any, role: str) -> str:
    """An edge's ``role`` (sender / receiver) as a node name: a :class:`HeadRef` or a :class:`Node` by its name, a
    string as given (parsed by the caller)."""
    if isinstance(value, (HeadRef, Node)):
        return value.name
    if isinstance(value, str):
        return value.strip()
    raise InputError(f"an edge's {role} must be a node name (embed, L1H2, MLP3, logits) or a HeadRef, got "
                     f"{type(value).__name__}")


@dataclass(frozen=True)
class Edge:
    """One edge of the graph: ``sender`` (``embed``, a head, ``MLP{l}``) into ``receiver``'s ``input`` at
    ``positions``. The receiver is a head (``L18H6``), the heads that share one input channel (``L5H0+L5H1``, a KV or
    B/C group), an MLP (input ``mlp``) or ``logits`` (input ``logits``, the default receiver: a direct edge).

    Fields are node names (a :class:`HeadRef` or ``None`` for the logits is taken and named); ``input`` may be left
    out where the receiver has one (an MLP, the logits). Checked for meaning when made, each error naming the edge:
    the nodes parse, the input is one the receiver reads, the positions one of :data:`POSITIONS`, and the receiver
    reads after the sender writes (a head receiver in a later layer). Whether the nodes exist in a model is the
    caller's to check against it. Printed ``L16H0 -> L18H6.k@items``, ``MLP3 -> MLP5.mlp@other``, ``L18H6 -> logits``
    (:attr:`name`), parsed back by :meth:`parse`."""

    sender: str
    receiver: str = LOGITS
    input: str | None = None
    positions: str = "all"

    def __post_init__(self) -> None:
        sender = _node_name(self.sender, "sender")
        receiver = LOGITS if self.receiver is None else _node_name(self.receiver, "receiver")
        object.__setattr__(self, "sender", sender)
        object.__setattr__(self, "receiver", receiver)
        for field_name in ("input", "positions"):
            value = getattr(self, field_name)
            if not isinstance(value, str) and not (field_name == "input" and value is None):
                raise InputError(f"an edge's {field_name} must be a string, got {type(value).__name__} ({value!r:.40})")
        where = f"{_shown(sender, 40)} -> {_shown(receiver, 60)}"
        s_node = _parsed(sender)
        if s_node.kind == "logits":
            raise InputError(f"the edge {where}: the logits send nothing; a sender is embed, a head or an MLP")
        if self.positions not in POSITIONS:
            raise InputError(f"unknown positions {self.positions[:40]!r} in the edge {where}; choose one of {POSITIONS}")
        names = _GROUP.split(receiver)  # L5H0+L5H1: a group's shared input (L35C3184+8 is one channel group)
        nodes = [_parsed(n) for n in names]
        kinds = {n.kind for n in nodes}
        kind = nodes[0].kind
        if len(nodes) > 1 and kinds != {"head"}:
            raise InputError(f"the edge {where}: a shared receiver input is named by its heads, e.g. L5H0+L5H1")
        inp = self.input if self.input is not None else (RECEIVES[kind][0] if kind in ("mlp", "logits") else None)
        if kind == "logits" and inp != LOGITS:
            raise InputError(f"a direct edge (no receiver) reads the logits: input must be {LOGITS!r}, got "
                             f"{str(inp)[:40]!r} ({where})")
        if kind == "embed":
            raise InputError(f"the edge {where}: the embeddings receive nothing")
        if kind == "head":
            if inp is None:
                raise InputError(f"the edge {where}: name the receiver's input, one of {RECEIVES['head']}")
            if inp == LOGITS:
                raise InputError(f"the edge {where}: input {LOGITS!r} belongs to a direct edge, which has no receiver "
                                 f"(Edge(sender) or Edge(sender, 'logits')); a head receiver reads one of "
                                 f"{RECEIVES['head']}")
            if inp not in RECEIVES["head"]:
                raise InputError(f"unknown receiver input {inp[:40]!r} in the edge {where}; choose one of "
                                 f"{RECEIVES['head']}")
            for n in nodes:
                assert n.head is not None
                if n.head.width != 1:
                    raise HeadError(f"{where}: a receiver must be a single head, not a channel group")
                if s_node.kind == "head" and n.head.layer <= (s_node.layer or 0):
                    raise HeadError(f"{where}: the receiver must sit in a later layer than the sender ({n.name} is "
                                    f"in layer {n.head.layer}, {sender} in layer {s_node.layer})")
        if kind == "mlp" and inp != "mlp":
            raise InputError(f"the edge {where}: an MLP reads one input, 'mlp', not {str(inp)[:40]!r}")
        if kind != "logits" and min(n.order for n in nodes) <= s_node.order:
            raise InputError(f"the edge {where}: the receiver reads before the sender writes ({receiver} reads in "
                             f"layer {nodes[0].layer}, {sender} writes in layer {s_node.layer})")
        object.__setattr__(self, "input", inp)

    @property
    def name(self) -> str:
        """``L16H2 -> L18H6.k@summary``, ``MLP3 -> MLP5.mlp@other``, ``L18H6 -> logits`` (``@POSITIONS`` added where
        a direct edge reads fewer than all positions)."""
        if self.receiver == LOGITS:
            return f"{self.sender} -> {LOGITS}" + ("" if self.positions == "all" else f"@{self.positions}")
        return f"{self.sender} -> {self.receiver}.{self.input}@{self.positions}"

    @property
    def direct(self) -> bool:
        """Whether the edge reads the logits (no receiver head or MLP)."""
        return self.receiver == LOGITS

    @property
    def reads(self) -> str:
        """The receiver input as one name: ``L5H2.q``, ``L5H0+L5H1.k``, ``MLP5``, ``logits`` (the inverse of
        :meth:`at`)."""
        return self.receiver if self.receiver == LOGITS or self.input == "mlp" else f"{self.receiver}.{self.input}"

    @property
    def sender_head(self) -> HeadRef | None:
        """The sender as a :class:`HeadRef` (None for the embeddings and an MLP)."""
        return _parsed(self.sender).head

    @property
    def receiver_head(self) -> HeadRef | None:
        """The receiver as a :class:`HeadRef` where it is one head (None for a group, an MLP and the logits)."""
        return None if self.direct or len(_GROUP.split(self.receiver)) > 1 else _parsed(self.receiver).head

    @classmethod
    def made(cls, sender: str, receiver: str, input: str, positions: str) -> "Edge":
        """The edge of these four names, taken as they are, unchecked: for code that enumerates a model's graph
        (hundreds of thousands of edges, each valid by construction)."""
        edge = object.__new__(cls)
        for name, value in (("sender", sender), ("receiver", receiver), ("input", input), ("positions", positions)):
            object.__setattr__(edge, name, value)
        return edge

    @classmethod
    def at(cls, sender: Any, reads: str, positions: str) -> "Edge":
        """The edge from ``sender`` into the receiver input named ``reads`` (:attr:`reads`: ``L5H2.q``, ``MLP5``,
        ``logits``)."""
        if not isinstance(reads, str):
            raise InputError(f"a receiver input is a name like L5H2.q, MLP5 or logits, got {type(reads).__name__}")
        nodes, inp = receiver_nodes(reads)
        return cls(sender, "+".join(nodes), inp, positions)

    @classmethod
    def parse(cls, name: object) -> "Edge":
        """The edge of :attr:`name` (``L3H1 -> L5H0+L5H1.k@items``, ``MLP2 -> MLP5.mlp@other``, ``L3H1 -> logits``);
        receiver inputs written as :attr:`reads` (``MLP5@items``, ``logits@all``) are read too."""
        text = str(name)
        sender, sep, rest = text.partition(" -> ")
        target, at, positions = rest.rpartition("@") if "@" in rest else (rest, "@", "all")
        if not (sep and at and sender and target and positions):
            raise InputError(f"not an edge name: {text[:80]!r} (expected 'SENDER -> RECEIVER.INPUT@POSITIONS', e.g. "
                             f"'L0H3 -> L1H3.k@items', or 'SENDER -> logits')")
        if target != LOGITS and "." not in target:
            return cls.at(sender, target, positions)
        receiver, _, inp = target.rpartition(".") if target != LOGITS else (LOGITS, "", LOGITS)
        return cls(sender, receiver, inp, positions)

    def to_dict(self) -> dict[str, Any]:
        """``sender``, ``receiver``, ``input``, ``positions`` (read back by :meth:`from_dict`)."""
        return {"sender": self.sender, "receiver": self.receiver, "input": self.input, "positions": self.positions}

    @classmethod
    def from_dict(cls, d: Any) -> "Edge":
        """The edge of :meth:`to_dict` (or of an edge-table row; a receiver ``None`` is the logits)."""
        if not isinstance(d, dict):
            raise InputError(f"an edge must be a mapping with sender, receiver, input, positions, got {type(d).__name__}")
        return cls(d.get("sender"), d.get("receiver"), d.get("input"), d.get("positions", "all"))


@dataclass(frozen=True)
class ReceiverInput:
    """One receiver input of a model's graph: ``name`` (:attr:`Edge.reads`: ``L5H2.q``, ``L5H0+L5H1.k`` for channels
    several heads share, ``MLP5``), the ``layer`` it is read in, the ``heads`` that read it (none for an MLP), the
    ``input`` (``q`` / ``k`` / ``v`` / ``other`` or ``mlp``), the ``sites`` its channels are read at (an MLP's whole
    input: ``start`` -1) and the residual ``stream`` hook it reads from."""

    name: str
    layer: int
    heads: tuple[HeadRef, ...]
    input: str
    sites: tuple[InputSite, ...]
    stream: str

    @property
    def head(self) -> HeadRef | None:
        """The one head that reads the input (None for an MLP's input and for a shared one)."""
        return self.heads[0] if len(self.heads) == 1 else None

    @property
    def node(self) -> str:
        """The node that reads it, by name (a shared input's first head)."""
        return self.heads[0].name if self.heads else mlp_name(self.layer)

    @property
    def order(self) -> float:
        """When it is read (:attr:`Node.order`: an MLP after its block's heads, so it reads their writes)."""
        return self.layer + (0.5 if self.input == "mlp" else 0.0)


def sender_names(model: Any) -> list[str]:
    """Every sender of ``model``'s graph in write order: the embeddings, then each layer's heads and its MLP."""
    heads = model.heads()
    return [EMBED] + [n for layer in range(model.n_layers) for n in [*(h.name for h in heads if h.layer == layer)]
                      + ([mlp_name(layer)] if model.mlp_hook(layer, "out") else [])]


def receiver_inputs(model: Any, shared: bool = False, strict: bool = False) -> list[ReceiverInput]:
    """Every receiver input of ``model``'s graph, from its head adapters
    (:meth:`~gna_interp.models.mixer.MixerAdapter.receiver_inputs`) and its MLP hooks: each head's inputs (with
    ``shared``, channels several heads read -- a KV or B/C group -- are one input named by its heads), then each
    MLP's, in layer order (a block's heads before its MLP). Heads whose kind cannot receive are left out, or, with
    ``strict``, refused (:class:`UnsupportedArchitectureError`), as is a channel two inputs read."""
    groups: dict[tuple[int, str, tuple], list[HeadRef]] = {}
    for head in model.heads():
        spec = model.layer_spec(head.layer, head.kind)
        try:
            inputs = spec.adapter.receiver_inputs(model, spec, head)
        except UnsupportedArchitectureError as e:  # a kind that cannot receive (Mamba-1, attention without q/k/v hooks)
            if strict:
                raise UnsupportedArchitectureError(f"an edge circuit needs every head to receive: {e}") from None
            continue
        for inp, sites in inputs.items():
            if sites:
                key = (head.layer, inp, tuple((x.hook, x.start, x.stop) for x in sites))
                groups.setdefault(key if shared else (*key, head.name), []).append(head)
    out, owner = [], {}
    for (layer, inp, key, *_), heads in groups.items():
        name = "+".join(h.name for h in heads) + f".{inp}"
        for hook, a, b in key if strict else ():
            for c in range(a, b):
                if owner.setdefault((hook, c), name) != name:
                    raise UnsupportedArchitectureError(
                        f"an edge circuit needs each input channel read by one receiver input, but channel {c} of "
                        f"{hook} feeds both {owner[(hook, c)]} and {name}")
        out.append(ReceiverInput(name, layer, tuple(heads), inp, tuple(InputSite(*x) for x in key),
                                 model.block_input_hook(layer)))
    for layer in range(model.n_layers):
        hook = model.mlp_hook(layer, "in")
        if hook:
            stream = model.mixed_stream_hook(layer)
            stream = stream if stream != model.block_output_hook(layer) else model.block_input_hook(layer)
            out.append(ReceiverInput(mlp_name(layer), layer, (), "mlp", (InputSite(hook, -1, -1),), stream))
    return sorted(out, key=lambda r: (r.layer, not r.heads, r.name))
