"""Heads and edges out of gna_interp, into TransformerLens hooks, nnsight or plain PyTorch code.

A head lives at one place in the network: the channels ``start:stop`` of the input of its layer's output projection
(``o_proj`` for attention, ``out_proj`` for Mamba); an edge's receiver reads one of its inputs (``q``, ``k``, ``v``)
from the channels of a projection's output. :func:`head_addresses` and :func:`edge_addresses` name those places in
the vocabularies other tools use:

- ``hook``: the TransformerLens hook on ``model.bridge`` (attention hooks exist on any ``TransformerBridge`` of the
  same checkpoint; hooks of SSM heads are added by gna_interp and exist on ``model.bridge`` only);
- ``module`` and ``side``: the dotted path of the Hugging Face module inside ``model.hf_model`` -- the same path
  inside the module of an nnsight ``LanguageModel`` of that checkpoint (``lm.model.layers[1].self_attn.o_proj``)
  -- and whether the channels are its ``input`` (the first positional argument) or its ``output``;
- ``start``, ``stop``: the channels, on the last dimension of that tensor, out of its ``width``; ``head_dim`` the
  channels of one head of that layer.

:func:`ablation_hooks` turns heads into TransformerLens ``fwd_hooks`` and :func:`ablated_modules` into PyTorch
forward pre-hooks on a Hugging Face model: both zero-ablate exactly as :func:`gna_interp.ablate` does
(``method="zero"``), which the tests check on the logits. :func:`ablated_modules` first checks the model it is given
against each address (the module is there, its width and head size are the address's) and refuses a model of
another shape with :class:`~gna_interp.errors.InputError`, rather than zero the wrong channels or none.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from gna_interp.errors import HeadError, InputError
from gna_interp.models.graph import LOGITS, POSITIONS
from gna_interp.models.heads import HeadRef
from gna_interp.models.hf import unwrap
from gna_interp.models.mixer import ChannelSpan
from gna_interp.models.model import check_model

__all__ = ["Address", "ablated_modules", "ablation_hooks", "edge_addresses", "head_addresses"]


@dataclass(frozen=True)
class Address(ChannelSpan):
    """One head's channels at one place of the network.

    ``head`` is its name (``L1H3``); ``input`` is ``"output"`` for where the head writes, or the input it reads
    (``"q"``, ``"k"``, ``"v"``, ``"other"``); ``hook`` the TransformerLens hook name on ``model.bridge``; ``module``
    the dotted path of the Hugging Face module in ``model.hf_model`` (None when the hook sits on no module's input or
    output, e.g. inside a Mamba mixer), ``side`` ``"input"`` or ``"output"`` of that module; ``start:stop`` the
    channels on the tensor's last dimension, ``width`` the tensor's channels and ``head_dim`` the channels of one head
    as the layer's mixer module declares them (its ``head_dim``), in the model the address was taken from (None: not
    known, not checked)."""

    head: str
    input: str
    hook: str
    module: str | None
    side: str
    start: int
    stop: int
    width: int | None = None
    head_dim: int | None = None

    def __post_init__(self) -> None:
        for name in ("head", "input", "hook", "side"):
            if not isinstance(getattr(self, name), str):
                raise InputError(f"an address's {name} must be a string, got {getattr(self, name)!r:.60}")
        if self.module is not None and not isinstance(self.module, str):
            raise InputError(f"the address of {self.head}: module must be a dotted path or None, got "
                             f"{self.module!r:.60}")
        if self.side not in ("input", "output"):
            raise InputError(f"the address of {self.head}: side must be 'input' or 'output', got {self.side!r:.40}")
        for name in ("start", "stop", "width", "head_dim"):
            v = getattr(self, name)
            if v is None and name in ("width", "head_dim"):
                continue
            least = 0 if name == "start" else 1  # a tensor, a head, a span holds a channel at least
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise InputError(f"the address of {self.head}: {name} must be an integer >= {least}, got {v!r:.40}")
        if self.stop <= self.start or (self.width is not None and self.stop > self.width):
            raise InputError(f"the address of {self.head}: channels {self.start}:{self.stop} are no span of a tensor "
                             f"of {self.width if self.width is not None else 'its'} channels")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_FIELDS = tuple(f.name for f in fields(Address))
_REQUIRED = tuple(f.name for f in fields(Address) if f.default is MISSING)


def _as_address(value: Any) -> Address:
    """``value`` (an :class:`Address` or its ``to_dict()``) as an Address; :class:`InputError` saying what to pass."""
    if isinstance(value, Address):
        return value
    if not isinstance(value, Mapping):
        raise InputError(f"an address must be an Address or its to_dict(), got {type(value).__name__}: pass the output "
                         f"of head_addresses(model, heads)")
    unknown = sorted(set(value) - set(_FIELDS))
    missing = [k for k in _REQUIRED if k not in value]
    if unknown or missing:
        wrong = "; ".join([f"this one lacks {missing}"] * bool(missing)
                          + [f"{unknown} are none of them"] * bool(unknown))
        hint = ": this is a row of edge_addresses, pass its 'sender' or 'receiver' address" if "sender" in value else ""
        raise InputError(f"an address has the keys {list(_FIELDS)} (width and head_dim may be left out); {wrong}{hint}")
    return Address(**value)


def _addresses(addresses: Any) -> list[Address]:
    """One address or a list of them, as Addresses; a string or another type refused, saying what to pass."""
    if isinstance(addresses, (Address, Mapping)):
        return [_as_address(addresses)]
    if isinstance(addresses, (str, bytes)) or not isinstance(addresses, Iterable):
        example = (f" (for heads by name: ablated_modules(hf_model, head_addresses(model, {addresses!r:.40})))"
                   if isinstance(addresses, str) else "")
        raise InputError(f"addresses must be the output of head_addresses(model, heads) -- a list of Address, or "
                         f"one -- got {type(addresses).__name__}{example}")
    return [_as_address(a) for a in addresses]


def _declared_width(module: torch.nn.Module, side: str) -> int | None:
    """The channels ``module`` takes (``side="input"``) or gives: a linear layer's ``in_features`` /
    ``out_features`` (GPT-2's ``Conv1D``: ``nx`` / ``nf``); None when the module does not say."""
    for name in (("in_features", "nx") if side == "input" else ("out_features", "nf")):
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _declared_head_dim(module: torch.nn.Module | None) -> int | None:
    """The channels of one head that a mixer module declares (``head_dim``; GPT-NeoX: ``head_size``), or None."""
    for name in ("head_dim", "head_size"):
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _place(model: Any, hook: str) -> tuple[str | None, str, torch.nn.Module | None]:
    """The Hugging Face module behind a bridge hook ``PATH.hook_in`` / ``PATH.hook_out``: its dotted path in
    ``model.hf_model``, the side the hook is on, and the module (None, None when no module is behind it)."""
    path, _, point = hook.rpartition(".")
    side = {"hook_in": "input", "hook_out": "output"}.get(point)
    if side is None or not path:
        return None, "input", None
    try:
        target = unwrap(model.bridge.get_submodule(path))
    except AttributeError:
        return None, side, None
    names = {id(m): n for n, m in model.hf_model.named_modules()}
    name = names.get(id(target))
    if name is None:
        return None, side, None
    # the bridge wraps Hugging Face modules in place (PATH._original_component): the checkpoint's own path drops those
    return ".".join(p for p in name.split(".") if p not in ("_original_component", "original_component")), side, target


def _address(model: Any, head: HeadRef, input: str, site: Any, width: int | None = None) -> Address:
    """The :class:`Address` of ``head``'s channels at ``site`` (a head or input site of ``model``)."""
    module, side, target = _place(model, site.hook)
    if width is None and target is not None:
        width = _declared_width(target, side)
    mixer = model.hf_module(model.layer_spec(head.layer, head.kind).bridge_path)
    return Address(head.name, input, site.hook, module, side, site.start, site.stop, width, _declared_head_dim(mixer))


def head_addresses(model: Any, heads: Sequence[HeadRef | str] | str | HeadRef) -> list[Address]:
    """Where each head of ``heads`` writes (its output channels), as :class:`Address` rows; ``heads`` is a list of
    heads or names, a comma-separated string, or an object with ``.heads`` (a :class:`~gna_interp.circuits.Circuit`,
    whose ``heads`` are its ranked heads) -- take its top ones first: ``head_addresses(model, circuit.heads[:5])``."""
    check_model(model, runnable=False)
    if not isinstance(heads, (str, list, tuple, HeadRef)) and hasattr(heads, "heads"):
        heads = heads.heads() if callable(heads.heads) else heads.heads
    out = []
    for h in model.check_heads(heads):
        site = model.head_site(h)
        out.append(_address(model, h, "output", site, site.width))
    return out


def _missing(value: Any) -> bool:
    """An empty cell: None, or NaN (a pandas table's empty receiver)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _edge_record(edge: Any) -> Mapping[str, Any]:
    """One edge as a mapping with ``sender``, ``receiver``, ``input`` (and ``positions``, effects when known)."""
    if isinstance(edge, Mapping):
        return edge
    if hasattr(edge, "sender") and hasattr(edge, "input"):
        if callable(getattr(edge, "to_dict", None)):
            return edge.to_dict()
        return {k: getattr(edge, k, None) for k in ("sender", "receiver", "input", "positions")}
    raise InputError(f"an edge must be a circuit Edge, a dict or a row of circuit.edges, got {type(edge).__name__}")


def _edge_records(edges: Any) -> list[Mapping[str, Any]]:
    """``edges`` as one mapping per edge: a circuit (its ``.edges``), an edge table (a DataFrame with the columns
    sender, receiver, input), a list of edges (Edge objects, whole-circuit edges or mappings), or one edge."""
    if not hasattr(edges, "columns") and not hasattr(edges, "sender") and hasattr(edges, "edges"):
        if edges.edges is None:
            raise InputError(f"this {type(edges).__name__} has no edge table (its edges were not measured): "
                             f"nothing to address")
        edges = edges.edges
    if hasattr(edges, "to_dict") and hasattr(edges, "columns"):  # a DataFrame: a circuit's edge table
        missing = {"sender", "receiver", "input"} - set(edges.columns)
        if missing:
            raise InputError(f"an edge table needs the columns sender, receiver, input (a circuit's .edges); this one "
                             f"lacks {sorted(missing)}")
        return edges.to_dict("records")
    if isinstance(edges, Mapping) or hasattr(edges, "sender"):
        return [_edge_record(edges)]
    if isinstance(edges, (str, bytes)) or not isinstance(edges, Iterable):
        raise InputError(f"edges must be a circuit's edge table (circuit.edges) or a list of edges, got "
                         f"{type(edges).__name__}")
    return [_edge_record(e) for e in edges]


def _edge_head(model: Any, value: Any, role: str, label: str) -> HeadRef:
    """An edge's sender or receiver as a head of ``model``; a node that is no head (``MLP3``, ``embed``) refused."""
    try:
        head = HeadRef.parse(value) if isinstance(value, (str, HeadRef)) else None
    except HeadError:
        head = None
    if head is None:
        raise InputError(f"the edge {label}: its {role} {value!r:.40} is not a head; edge_addresses addresses edges "
                         f"between heads and a head's direct path to the logits (a whole circuit's MLP and embedding "
                         f"nodes have no head address)")
    try:
        return model.check_head(head)
    except HeadError as e:
        raise HeadError(f"the edge {label}: {e}") from None


def _parse_edge(model: Any, row: Mapping[str, Any]) -> tuple[HeadRef, HeadRef | None, str, str]:
    """``(sender, receiver or None, input, positions)`` of one edge, checked for meaning against ``model``:
    :class:`InputError` / :class:`HeadError` naming the edge otherwise."""
    sender, receiver, inp = row.get("sender"), row.get("receiver"), row.get("input")
    positions = "all" if _missing(row.get("positions")) else row.get("positions")
    direct = _missing(receiver) or receiver == LOGITS
    inp = LOGITS if direct and _missing(inp) else inp
    label = f"{sender} -> " + (LOGITS if direct else f"{receiver}.{inp}")
    if positions not in POSITIONS:
        raise InputError(f"the edge {label}: positions {positions!r:.40} are none of {', '.join(POSITIONS)}")
    if isinstance(row.get("edge"), str) and " + " in row["edge"]:
        raise InputError(f"the row {row['edge']!r:.80} stands for a set of edges, and its sender / receiver columns "
                         f"name only the first: address each edge on its own")
    s = _edge_head(model, sender, "sender", label)
    if direct:
        if inp != LOGITS:
            raise InputError(f"the edge {label}: a direct edge (receiver {LOGITS!r} or None) reads the logits, so its "
                             f"input must be {LOGITS!r}, got {inp!r:.40}; an edge into a head's {inp!r:.40} names that "
                             f"head as its receiver")
        return s, None, LOGITS, positions
    r = _edge_head(model, receiver, "receiver", label)
    if r == s:
        raise HeadError(f"the edge {label}: a head cannot feed itself")
    if r.layer <= s.layer:
        raise HeadError(f"the edge {label}: the receiver must sit in a later layer than the sender ({r.name} is in "
                        f"layer {r.layer}, {s.name} in layer {s.layer}): a head reads only what earlier layers wrote")
    if not isinstance(inp, str) or inp == LOGITS:
        raise InputError(f"the edge {label}: input {inp!r:.40} is not one a head reads: {LOGITS!r} belongs to a direct "
                         f"edge (receiver {LOGITS!r}); a head receiver reads one of q, k, v (other: an SSM head's gate "
                         f"and step size)")
    return s, r, inp, positions


def _numbers(row: Mapping[str, Any], label: str) -> dict[str, Any]:
    """The ``score`` / ``effect`` / ``low`` / ``high`` an edge row gives, each a number or empty (None, NaN)."""
    out = {k: row[k] for k in ("score", "effect", "low", "high") if k in row}
    for k, v in out.items():
        if not _missing(v) and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise InputError(f"the edge {label}: its {k} must be a number, got {type(v).__name__} {v!r:.40}")
    return out


def _receiver_addresses(model: Any, head: HeadRef, inp: str) -> list[Address]:
    """Where ``head`` reads its input ``inp``: one :class:`Address` per span (an SSM head's ``other``: two)."""
    spec = model.layer_spec(head.layer, head.kind)
    sites = spec.adapter.receiver_inputs(model, spec, head)
    if not sites.get(inp):
        reads = ", ".join(k for k, v in sites.items() if v)
        raise InputError(f"{head.name} reads no input {inp!r:.40} (its inputs: {reads})")
    return [_address(model, head, inp, site) for site in sites[inp]]


def edge_addresses(model: Any, edges: Any) -> list[dict[str, Any]]:
    """Each edge of ``edges`` as one dict. ``edges`` is what gna_interp writes: a circuit's edge table
    ``circuit.edges`` (its direct edges have the receiver ``logits``) or the circuit itself, a whole circuit's edges
    between heads (``circuit.whole.edges``), a list of Edge objects or dicts with ``sender``, ``receiver``,
    ``input``, or one of them. Each dict holds ``edge`` (its name), ``positions``, the ``score`` / ``effect`` /
    ``low`` / ``high`` when given, ``sender`` (the :class:`Address` where the sender writes, as a dict),
    ``receivers`` (the Addresses where the receiver reads its input: the ``q``/``k``/``v`` projection's output
    channels -- for grouped-query attention the key/value group's --, two spans for an SSM head's ``other``; empty
    for an edge straight to the logits) and ``receiver`` (the only one of them; None for a direct edge or several).

    An edge that cannot be (a receiver in the sender's layer or before it, a head feeding itself, a direct edge
    read through ``q``/``k``/``v``, an input the receiver does not read, a node that is no head) is refused with
    :class:`~gna_interp.errors.InputError` or :class:`~gna_interp.errors.HeadError` naming it."""
    check_model(model, runnable=False)
    out = []
    for row in _edge_records(edges):
        s, r, inp, positions = _parse_edge(model, row)
        receivers = [] if r is None else _receiver_addresses(model, r, inp)
        name = (f"{s.name} -> {r.name}.{inp}@{positions}" if r is not None
                else f"{s.name} -> {LOGITS}" + ("" if positions == "all" else f"@{positions}"))
        out.append({"edge": name, "positions": positions, **_numbers(row, name),
                    "sender": head_addresses(model, [s])[0].to_dict(),
                    "receiver": receivers[0].to_dict() if len(receivers) == 1 else None,
                    "receivers": [a.to_dict() for a in receivers]})
    return out


def _zero(columns: list[slice], width: int | None = None, where: str = "") -> Callable[..., Tensor]:
    """A hook that zeroes ``columns`` of a value's flat channels (checked to be ``width`` wide when given)."""
    need = max(c.stop for c in columns)

    def hook(value: Float[Tensor, "batch pos *channels"], hook: Any = None) -> Float[Tensor, "batch pos *channels"]:
        value = value.clone()
        flat = value.view(*value.shape[:2], -1) if value.dim() == 4 else value  # [batch, pos, heads, d_head] too
        have = flat.shape[-1]
        if have < need or (width is not None and have != width):
            raise InputError(f"{where} carries {have} channels, the addresses there need {width or need}: they were "
                             f"taken from a model of another shape")
        for c in columns:
            flat[..., c] = 0
        return value
    return hook


def _grouped(rows: Iterable[Address], key: Callable[[Address], Any]) -> dict[Any, list[Address]]:
    out: dict[Any, list[Address]] = {}
    for a in rows:
        out.setdefault(key(a), []).append(a)
    return out


def ablation_hooks(model: Any, heads: Sequence[HeadRef | str] | str) -> list[tuple[str, Callable[..., Tensor]]]:
    """TransformerLens ``fwd_hooks`` that zero ``heads``' output channels: pass them to ``model.run_with_hooks``,
    ``model.hooks(...)`` or ``model.bridge.run_with_hooks(ids, fwd_hooks=...)``; the same as ``gna.ablate(model,
    heads)`` with ``method="zero"``."""
    groups = _grouped(head_addresses(model, heads), lambda a: a.hook)
    return [(hook, _zero([a.columns for a in rows], rows[0].width, hook)) for hook, rows in groups.items()]


def _submodule(root: torch.nn.Module, path: str, head: str) -> torch.nn.Module:
    """``root``'s module at the dotted ``path``; :class:`InputError` naming the missing part (a layer: how many the
    model has)."""
    mod = root
    parts = path.split(".")
    for i, part in enumerate(parts):
        child = mod._modules.get(part)
        if child is None:
            done = ".".join(parts[:i])
            if isinstance(mod, torch.nn.ModuleList) and part.isdigit():
                raise InputError(f"{type(root).__name__} has {len(mod)} layers ({done}.0 .. {done}.{len(mod) - 1}); "
                                 f"the address of {head} needs layer {part} ({path}): pass the Hugging Face model of "
                                 f"the checkpoint the addresses were taken from")
            raise InputError(f"{type(root).__name__} has no module {path!r} (no {part!r} in {done or 'the model'}), "
                             f"which the address of {head} names: pass the Hugging Face model of the checkpoint the "
                             f"addresses were taken from")
        mod = child
    return mod


def _fitting_module(hf_model: torch.nn.Module, module: str, side: str, rows: list[Address]) -> torch.nn.Module:
    """The module of ``hf_model`` that ``rows`` (addresses of one module and side) name, checked to have their
    width and head size; :class:`InputError` saying what the model has and what an address needs otherwise."""
    target = _submodule(hf_model, module, rows[0].head)
    width = _declared_width(target, side)
    if width is None and any(a.width is not None for a in rows):
        raise InputError(f"{type(hf_model).__name__}'s {module} is a {type(target).__name__}, which declares no "
                         f"channels at its {side}; the address of {rows[0].head} names a projection's (a linear "
                         f"layer's) {side}: pass the Hugging Face model of the checkpoint the addresses were taken from")
    parent = _submodule(hf_model, module.rpartition(".")[0], rows[0].head) if "." in module else None
    head_dim = _declared_head_dim(parent)
    model = type(hf_model).__name__
    for a in rows:
        if width is not None and (a.stop > width or a.width not in (None, width)):
            needs = a.width if a.width is not None else f"at least {a.stop}"
            raise InputError(f"{model}'s {module} has {width} channels at its {side}; the address of {a.head} needs "
                             f"{needs} (channels {a.start}:{a.stop}): it was taken from a model of another width. "
                             f"Pass the Hugging Face model of the checkpoint the addresses were taken from")
        if head_dim is not None and a.head_dim not in (None, head_dim):
            heads = f" ({width // head_dim} heads there)" if width else ""
            theirs = f" ({a.width // a.head_dim} heads)" if a.width else ""
            raise InputError(f"{model}'s {module.rpartition('.')[0]} has heads of {head_dim} channels{heads}; the "
                             f"address of {a.head} needs heads of {a.head_dim}{theirs}: it was taken from a model with "
                             f"another head count. Pass the Hugging Face model of the checkpoint the addresses were "
                             f"taken from")
    return target


def _first_argument(zero: Callable[..., Tensor], module: str) -> Callable[..., Any]:
    """A forward pre-hook applying ``zero`` to the first positional argument of the module at ``module``."""
    def pre(_m: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if not args or not isinstance(args[0], Tensor):
            raise InputError(f"{module} was called without a tensor as its first positional argument, which the "
                             f"address zeroes: it names a module that takes its input otherwise")
        return (zero(args[0]), *args[1:]), kwargs
    return pre


@contextlib.contextmanager
def ablated_modules(hf_model: torch.nn.Module, addresses: Sequence[Address | dict[str, Any]] | Address | dict[str, Any]
                    ) -> Iterator[None]:
    """Inside the block, ``hf_model`` (a plain Hugging Face model of the same checkpoint, or the module of an
    nnsight ``LanguageModel``) runs with the channels of ``addresses`` zeroed, through PyTorch forward (pre-)hooks
    on the named modules; removed on exit, exceptions included. ``addresses`` is the output of
    :func:`head_addresses` (Addresses or their ``to_dict()``), or one address.

    Every address is checked against ``hf_model`` before a hook is placed: the module is there (the layer exists),
    its width and its heads' size are the address's. A model of another shape is refused with
    :class:`~gna_interp.errors.InputError` saying what it has and what the address needs."""
    if not isinstance(hf_model, torch.nn.Module):
        raise InputError(f"ablated_modules takes a Hugging Face model (a torch module) first, got "
                         f"{type(hf_model).__name__}")
    rows = _addresses(addresses)
    for a in rows:
        if a.module is None:
            raise InputError(f"{a.head} has no Hugging Face module to hook ({a.hook}): use gna.ablate on the Model")
    groups = _grouped(rows, lambda a: (a.module, a.side))
    targets = {key: _fitting_module(hf_model, *key, group) for key, group in groups.items()}
    handles = []
    try:
        for (module, side), group in groups.items():
            width = next((a.width for a in group if a.width is not None), _declared_width(targets[module, side], side))
            zero = _zero([a.columns for a in group], width, f"{type(hf_model).__name__}'s {module} ({side})")
            if side == "input":
                handles.append(targets[module, side].register_forward_pre_hook(_first_argument(zero, module),
                                                                               with_kwargs=True))
            else:
                handles.append(targets[module, side].register_forward_hook(lambda _m, _a, out, z=zero: z(out)))
        yield
    finally:
        for h in handles:
            h.remove()
