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
- ``start``, ``stop``: the channels, on the last dimension of that tensor.

:func:`ablation_hooks` turns heads into TransformerLens ``fwd_hooks`` and :func:`ablated_modules` into PyTorch
forward pre-hooks on a Hugging Face model: both zero-ablate exactly as :func:`gna_interp.ablate` does
(``method="zero"``), which the tests check on the logits.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor

from gna_interp.errors import HeadError, InputError
from gna_interp.models.heads import HeadRef
from gna_interp.models.hf import unwrap
from gna_interp.models.mixer import ChannelSpan

__all__ = ["Address", "ablated_modules", "ablation_hooks", "edge_addresses", "head_addresses"]


@dataclass(frozen=True)
class Address(ChannelSpan):
    """One head's channels at one place of the network.

    ``head`` is its name (``L1H3``); ``input`` is ``"output"`` for where the head writes, or the input it reads
    (``"q"``, ``"k"``, ``"v"``); ``hook`` the TransformerLens hook name on ``model.bridge``; ``module`` the dotted
    path of the Hugging Face module in ``model.hf_model`` (None when the hook sits on no module's input or output,
    e.g. inside a Mamba mixer), ``side`` ``"input"`` or ``"output"`` of that module; ``start:stop`` the channels on
    the tensor's last dimension."""

    head: str
    input: str
    hook: str
    module: str | None
    side: str
    start: int
    stop: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _module_path(model: Any, hook: str) -> tuple[str | None, str]:
    """The Hugging Face module behind a bridge hook ``PATH.hook_in`` / ``PATH.hook_out`` and which side it is on."""
    path, _, point = hook.rpartition(".")
    side = {"hook_in": "input", "hook_out": "output"}.get(point)
    if side is None or not path:
        return None, "input"
    try:
        target = unwrap(model.bridge.get_submodule(path))
    except AttributeError:
        return None, side
    names = {id(m): n for n, m in model.hf_model.named_modules()}
    name = names.get(id(target))
    if name is None:
        return None, side
    # the bridge wraps Hugging Face modules in place (PATH._original_component): the checkpoint's own path drops those
    return ".".join(p for p in name.split(".") if p not in ("_original_component", "original_component")), side


def head_addresses(model: Any, heads: Sequence[HeadRef | str] | str | HeadRef) -> list[Address]:
    """Where each head of ``heads`` writes (its output channels), as :class:`Address` rows; ``heads`` is a list of
    heads or names, a comma-separated string, or an object with ``.heads`` (a :class:`~gna_interp.circuits.Circuit`,
    whose ``heads`` are its ranked heads) -- take its top ones first: ``head_addresses(model, circuit.heads[:5])``."""
    if not isinstance(heads, (str, list, tuple, HeadRef)) and hasattr(heads, "heads"):
        heads = heads.heads() if callable(heads.heads) else heads.heads
    out = []
    for h in model.check_heads(heads):
        site = model.head_site(h)
        module, side = _module_path(model, site.hook)
        out.append(Address(h.name, "output", site.hook, module, side, site.start, site.stop))
    return out


def _edge_rows(edges: Any) -> list[tuple[str, str | None, str, str, dict[str, Any]]]:
    if hasattr(edges, "to_dict") and hasattr(edges, "columns"):  # a DataFrame: a circuit's edge table
        missing = {"sender", "receiver", "input"} - set(edges.columns)
        if missing:
            raise InputError(f"an edge table needs the columns sender, receiver, input (a circuit's .edges); this one "
                             f"lacks {sorted(missing)}")
        rows = edges.to_dict("records")
    elif isinstance(edges, Iterable) and not isinstance(edges, (str, bytes)):
        rows = []
        for e in edges:
            if isinstance(e, dict):
                rows.append(e)
            elif hasattr(e, "sender") and hasattr(e, "input"):
                rows.append(e.to_dict() if hasattr(e, "to_dict") else
                            {"sender": e.sender, "receiver": e.receiver, "input": e.input})
            else:
                raise InputError(f"an edge must be a circuit Edge, a dict or a row of circuit.edges, got "
                                 f"{type(e).__name__}")
    else:
        raise InputError(f"edges must be a circuit's edge table (circuit.edges) or a list of edges, got "
                         f"{type(edges).__name__}")
    out = []
    for r in rows:
        sender = r.get("sender")
        receiver = r.get("receiver")
        receiver = None if receiver is None or (isinstance(receiver, float) and receiver != receiver) else receiver
        name = lambda h: h.name if isinstance(h, HeadRef) else str(h)  # noqa: E731
        out.append((name(sender), None if receiver is None else name(receiver), str(r.get("input")),
                    str(r.get("positions", "all")), r))
    return out


def edge_addresses(model: Any, edges: Any) -> list[dict[str, Any]]:
    """Each edge of ``edges`` (a circuit's edge table ``circuit.edges``, or a list of Edge objects or dicts with
    ``sender``, ``receiver``, ``input``) as one dict: ``edge`` (its name), ``positions``, the measured ``effect`` /
    ``low`` / ``high`` when given, ``sender`` (the :class:`Address` where the sender writes, as a dict) and
    ``receiver`` (the :class:`Address` of the receiver's ``q``/``k``/``v`` input channels -- for grouped-query
    attention the key/value group's -- or None for an edge straight to the logits)."""
    out = []
    for sender, receiver, inp, positions, row in _edge_rows(edges):
        send = head_addresses(model, [sender])[0]
        rec = None
        if receiver is not None:
            h = model.check_head(receiver)
            spec = model.layer_spec(h.layer, h.kind)
            sites = spec.adapter.receiver_inputs(model, spec, h).get(inp)
            if not sites:
                raise HeadError(f"{h.name} has no input {inp!r} to address (its inputs: q, k, v)")
            site = sites[0]
            module, side = _module_path(model, site.hook)
            rec = Address(h.name, inp, site.hook, module, side, site.start, site.stop).to_dict()
        name = row.get("edge") or (f"{sender} -> {receiver}.{inp}@{positions}" if receiver else f"{sender} -> logits")
        out.append({"edge": name, "positions": positions,
                    **{k: row[k] for k in ("effect", "low", "high") if k in row},
                    "sender": send.to_dict(), "receiver": rec})
    return out


def _zero(columns: list[slice]) -> Callable[[Tensor, Any], Tensor]:
    def hook(value: Tensor, hook: Any = None) -> Tensor:
        value = value.clone()
        flat = value.view(*value.shape[:2], -1) if value.dim() == 4 else value  # [batch, pos, heads, d_head] too
        for c in columns:
            flat[..., c] = 0
        return value
    return hook


def _by_hook(addresses: Iterable[Address]) -> dict[str, list[slice]]:
    out: dict[str, list[slice]] = {}
    for a in addresses:
        out.setdefault(a.hook, []).append(a.columns)
    return out


def ablation_hooks(model: Any, heads: Sequence[HeadRef | str] | str) -> list[tuple[str, Callable[..., Tensor]]]:
    """TransformerLens ``fwd_hooks`` that zero ``heads``' output channels: pass them to ``model.run_with_hooks``,
    ``model.hooks(...)`` or ``model.bridge.run_with_hooks(ids, fwd_hooks=...)``; the same as ``gna.ablate(model,
    heads)`` with ``method="zero"``."""
    return [(hook, _zero(cols)) for hook, cols in _by_hook(head_addresses(model, heads)).items()]


@contextlib.contextmanager
def ablated_modules(hf_model: torch.nn.Module, addresses: Sequence[Address | dict[str, Any]]) -> Iterator[None]:
    """Inside the block, ``hf_model`` (a plain Hugging Face model of the same checkpoint, or the module of an
    nnsight ``LanguageModel``) runs with the channels of ``addresses`` (:func:`head_addresses`) zeroed, through
    PyTorch forward (pre-)hooks on the named modules; removed on exit, exceptions included."""
    rows = [a if isinstance(a, Address) else Address(**a) for a in addresses]
    handles = []
    try:
        for (module, side), cols in _by_module(rows).items():
            try:
                target = hf_model.get_submodule(module)
            except AttributeError as e:
                raise InputError(f"{type(hf_model).__name__} has no module {module!r}: pass the Hugging Face model "
                                 f"of the checkpoint these addresses were taken from") from e
            zero = _zero(cols)
            if side == "input":
                handles.append(target.register_forward_pre_hook(
                    lambda _m, args, kwargs, z=zero: ((z(args[0]), *args[1:]), kwargs), with_kwargs=True))
            else:
                handles.append(target.register_forward_hook(lambda _m, _a, out, z=zero: z(out)))
        yield
    finally:
        for h in handles:
            h.remove()


def _by_module(rows: list[Address]) -> dict[tuple[str, str], list[slice]]:
    out: dict[tuple[str, str], list[slice]] = {}
    for a in rows:
        if a.module is None:
            raise InputError(f"{a.head} has no Hugging Face module to hook ({a.hook}): use gna.ablate on the Model")
        out.setdefault((a.module, a.side), []).append(a.columns)
    return out
