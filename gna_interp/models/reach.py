"""Hook points for token mixers that the TransformerLens bridge leaves without them.

TransformerLens reaches a Hugging Face module by wrapping it in a bridge component whose ``HookPoint``\\ s
fire on the module's input and output (``blocks.3.attn.o.hook_in``, ``blocks.3.mixer.hook_in``, ...).
A few mixers of the hybrid families are left without the hooks the mixer adapters need:

- **Zamba2**: the shared attention block of a hybrid layer (``shared_transformer.self_attn``, a
  ``Zamba2Attention``) and the Mamba-2 mixer of the same layer (``mamba_decoder.mamba``) are not
  wrapped at all (the bridge's block delegates the whole hybrid layer to Hugging Face);
- **Nemotron-H**: attention layers are wrapped by a pass-through mixer bridge (``blocks.{l}.mixer``)
  that has ``hook_in`` / ``hook_out`` but no pattern and no output-projection hook.

For such a module, its kind's adapter gives a :class:`ReachPlan` (:meth:`MixerAdapter.reach_plan
<gna_interp.models.mixer.MixerAdapter.reach_plan>`) and :func:`reach_mixers` installs the hook points
the way the bridge does for the others: a :class:`Reached` component (an ``nn.Module`` of
``HookPoint``\\ s, no parameters, its Hugging Face module as ``original_component``) is attached to the
bridge block -- or the missing hook points are added to the pass-through component that already wraps
the module -- their full names are registered with the bridge (``hook_dict``, ``hooks``,
``run_with_cache`` see them), and permanent torch hooks on the Hugging Face modules run the tensors
through them:

=========================  ==========================================================================
hook                       fires on (edits made by a hook function change the forward)
=========================  ==========================================================================
``{path}.hook_in``         the module's ``hidden_states`` argument (forward pre-hook)
``{path}.hook_out``        its output (``output[0]`` of a tuple)
``{path}.{sub}.hook_in``   input of a sub-module (``o`` = ``o_proj``; ``in_proj``, ``inner_norm`` =
                           ``norm``, ``out_proj`` of a Mamba mixer)
``{path}.{sub}.hook_out``  output of that sub-module
``{path}.hook_pattern``    the post-softmax attention weights ``[batch, head, q, k]``, *before* they
                           meet the values
=========================  ==========================================================================

``path`` is ``blocks.{l}.{name}``: the adapter's name for the kind (``attn``, ``mixer``), prefixed with
``shared_`` when the module's weights also run in another block (Zamba2: ``blocks.1.shared_attn``).

**The pattern hook.** The Hugging Face attention modules of these families compute their weights in an
attention function chosen by ``config._attn_implementation``. A reached attention module gets its own
copy of the config naming :data:`HOOKED_ATTENTION`, a function registered with transformers'
``AttentionInterface`` that calls the module's own ``eager_attention_forward`` (same numbers as the
eager model) and runs the weights ``P`` through ``hook_pattern``; when a hook edits them into ``P'``
the output becomes ``P' V`` (``V`` the module's own values, grouped-query heads repeated), still before
``o_proj`` -- so masking and ablation compose exactly and every hook fires once, in the order of a
bridged attention layer. In training mode with dropout the edited path leaves dropout out.
"""

from __future__ import annotations

import copy
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from gna_interp.errors import GnaError, UnsupportedArchitectureError
from gna_interp.models.hf import unwrap
from gna_interp.models.mixer import MixerAdapter, ReachPlan


HOOKED_ATTENTION = "gna_hooked_eager"

__all__ = ["HOOKED_ATTENTION", "ReachPlan", "Reached", "can_hook_pattern", "reach_mixers", "reached_kind"]


class Reached(torch.nn.Module):
    """Hook points made by gna_interp for one Hugging Face module the bridge does not hook.

    Holds ``hook_in`` / ``hook_out`` (and, as children, sub-components or ``hook_pattern``); its Hugging
    Face module is ``original_component`` but not a child, so the bridge's parameters are not
    duplicated. Calling it calls the Hugging Face module, whose torch hooks fire the hook points.
    """

    def __init__(self, original: torch.nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "original_component", original)  # not registered: no second copy of weights
        self.hook_in = _hook_point()
        self.hook_out = _hook_point()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The Hugging Face module's forward (its torch hooks fire this component's hook points)."""
        return self.original_component(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"original_component={type(self.original_component).__name__}"


@dataclass
class _PatternHook:
    hook: Any                        # the HookPoint
    base: Callable[..., Any]         # the module's own eager attention function


_KIND: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()
_PATTERN: "weakref.WeakKeyDictionary[torch.nn.Module, _PatternHook]" = weakref.WeakKeyDictionary()


def _hook_point() -> torch.nn.Module:
    from transformer_lens.hook_points import HookPoint

    return HookPoint()


def _is_hook_point(obj: Any) -> bool:
    from transformer_lens.hook_points import HookPoint

    return isinstance(obj, HookPoint)


def reached_kind(component: Any) -> str | None:
    """The head kind whose adapter reached ``component`` (a :class:`Reached` or a bridge component that
    gained hook points here), or None."""
    try:
        return _KIND.get(component)
    except TypeError:
        return None


# ---- the attention-pattern hook ---------------------------------------------------------------


def _eager_of(module: torch.nn.Module) -> Callable[..., Any] | None:
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    return fn if callable(fn) else None


def can_hook_pattern(module: torch.nn.Module) -> bool:
    """Whether the attention weights of a Hugging Face attention module can run through a hook before
    they meet the values: it dispatches on ``config._attn_implementation`` and its modeling file has an
    ``eager_attention_forward``."""
    cfg = getattr(module, "config", None)
    return cfg is not None and hasattr(cfg, "_attn_implementation") and _eager_of(module) is not None


def _hooked_attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Tensor | None, **kwargs: Any) -> tuple[Tensor, Tensor]:
    """Attention function :data:`HOOKED_ATTENTION`: the module's eager attention, its weights through
    ``hook_pattern``; edited weights ``P'`` give ``P' V``."""
    state = _PATTERN.get(module)
    if state is None:
        raise GnaError(f"{type(module).__name__} asks for the {HOOKED_ATTENTION!r} attention function but gna_interp "
                       f"installed no pattern hook on it (was the module copied out of its model?)")
    out, weights = state.base(module, query, key, value, attention_mask, **kwargs)
    if not isinstance(weights, Tensor):
        raise GnaError(f"{type(module).__name__}'s eager attention returned no weights; hook_pattern cannot fire")
    edited = state.hook(weights)
    if edited is weights:
        return out, weights
    if not isinstance(edited, Tensor) or edited.shape != weights.shape:
        raise GnaError(f"a hook on {state.hook.name} returned {type(edited).__name__} "
                       f"{tuple(getattr(edited, 'shape', ()))}; expected a tensor of shape {tuple(weights.shape)}")
    n_rep = query.shape[1] // value.shape[1]
    v = value.repeat_interleave(n_rep, dim=1) if n_rep > 1 else value  # query head h reads KV head h // n_rep
    z = torch.matmul(edited.to(v.dtype), v).transpose(1, 2).contiguous()
    if z.shape != out.shape:
        raise GnaError(f"{type(module).__name__}'s eager attention output has shape {tuple(out.shape)}, not the "
                       f"[batch, q, head, d_head] = {tuple(z.shape)} that an edited pattern gives")
    return z.to(out.dtype), edited


def _register_attention_function() -> None:
    from transformers import AttentionInterface

    if HOOKED_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(HOOKED_ATTENTION, _hooked_attention)


def _install_pattern_hook(module: torch.nn.Module, hook: Any) -> None:
    if module in _PATTERN:
        _PATTERN[module].hook = hook
        return
    base = _eager_of(module)
    if base is None or not can_hook_pattern(module):
        raise UnsupportedArchitectureError(f"cannot hook the attention pattern of {type(module).__name__}: it does not "
                                           f"dispatch on config._attn_implementation to an eager_attention_forward")
    _register_attention_function()
    cfg = copy.deepcopy(module.config)  # this module's own copy: no other module changes implementation
    cfg._attn_implementation = HOOKED_ATTENTION
    module.config = cfg
    _PATTERN[module] = _PatternHook(hook, base)


# ---- torch hooks running tensors through hook points -------------------------------------------


def _input_hook(point: Any) -> Callable[..., Any]:
    def pre(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if isinstance(kwargs.get("hidden_states"), Tensor):
            kwargs = {**kwargs, "hidden_states": point(kwargs["hidden_states"])}
            return args, kwargs
        if args and isinstance(args[0], Tensor):
            return (point(args[0]),) + tuple(args[1:]), kwargs
        return None

    return pre


def _output_hook(point: Any) -> Callable[..., Any]:
    def post(module: torch.nn.Module, args: tuple, output: Any) -> Any:
        if isinstance(output, Tensor):
            return point(output)
        if isinstance(output, tuple) and output and isinstance(output[0], Tensor):
            return (point(output[0]),) + output[1:]
        return None

    return post


def _hook_module(module: torch.nn.Module, hook_in: Any | None, hook_out: Any | None) -> None:
    if hook_in is not None:
        module.register_forward_pre_hook(_input_hook(hook_in), with_kwargs=True)
    if hook_out is not None:
        module.register_forward_hook(_output_hook(hook_out))


def _hook_at(component: torch.nn.Module, rel: str) -> bool:
    """Whether ``component`` has a HookPoint at the dotted path ``rel`` (its own children only)."""
    obj: Any = component
    for part in rel.split("."):
        children = getattr(obj, "_modules", {})
        obj = children.get(part) if part in children else obj.__dict__.get(part)
        if obj is None:
            return False
    return _is_hook_point(obj)


# ---- walking a block ----------------------------------------------------------------------------


def _bridge_components(module: torch.nn.Module, prefix: str = "") -> list[tuple[str, torch.nn.Module]]:
    """``(path, component)`` of the bridge components under ``module``, not descending into wrapped HF modules."""
    out: list[tuple[str, torch.nn.Module]] = []
    for name, child in module.named_children():
        if name in ("_original_component", "original_component") or _is_hook_point(child):
            continue
        path = f"{prefix}{name}"
        out.append((path, child))
        out.extend(_bridge_components(child, f"{path}."))
    return out


def _param_owners(blocks: list[torch.nn.Module]) -> dict[int, set[int]]:
    owners: dict[int, set[int]] = {}
    for i, block in enumerate(blocks):
        for p in unwrap(block).parameters():
            owners.setdefault(id(p), set()).add(i)
    return owners


def _register(bridge: Any, prefix: str, component: torch.nn.Module) -> None:
    """Register the hook points of a component made here under ``prefix`` + their path in it."""
    registry = getattr(bridge, "_hook_registry", None)
    if not isinstance(registry, dict):
        raise UnsupportedArchitectureError(
            f"this TransformerLens bridge ({type(bridge).__name__}) keeps no hook registry, so gna_interp cannot add "
            f"the hook points of mixers it does not wrap")
    for rel, mod in component.named_modules():
        if _is_hook_point(mod):
            mod.name = f"{prefix}.{rel}" if rel else prefix
            registry[mod.name] = mod


def _install(bridge: Any, layer: int, block: torch.nn.Module, module: torch.nn.Module, adapter_: MixerAdapter,
             plan: ReachPlan, wrapper: tuple[str, torch.nn.Module] | None, shared: bool) -> None:
    """Give ``module`` (HF) the hooks of ``plan``: extend ``wrapper`` (path, component) or attach a new component."""
    targets = {sub: getattr(module, attr, None) for sub, attr in plan.subs.items()}
    missing = [plan.subs[sub] for sub, t in targets.items() if not isinstance(t, torch.nn.Module)]
    if missing:  # checked before anything is attached: the bridge is left as it was
        raise UnsupportedArchitectureError(f"{type(module).__name__} in layer {layer} has no {missing[0]!r} module")
    if wrapper is None:
        name = f"shared_{plan.name}" if shared else plan.name
        base, k = name, 1
        while name in block._modules:
            name, k = f"{base}_{k}", k + 1
        component: torch.nn.Module = Reached(module)
        block.add_module(name, component)
        _hook_module(module, component.hook_in, component.hook_out)
        rel = name
        _register(bridge, f"blocks.{layer}.{rel}", component)
    else:
        rel, component = wrapper
    prefix = f"blocks.{layer}.{rel}"
    for sub, target in targets.items():
        if _hook_at(component, f"{sub}.hook_in"):
            continue
        child = Reached(unwrap(target))
        if sub in component._modules or sub not in component.__dict__ and not hasattr(component, sub):
            component.add_module(sub, child)
        else:  # the bridge component passes the HF module's attribute through (GraniteMoeHybrid's mixer: out_proj)
            component._modules[sub] = child
        _hook_module(unwrap(target), child.hook_in, child.hook_out)
        _register(bridge, f"{prefix}.{sub}", child)
    if plan.pattern and not _hook_at(component, "hook_pattern"):
        point = _hook_point()
        component.add_module("hook_pattern", point)
        _install_pattern_hook(module, point)
        _register(bridge, f"{prefix}.hook_pattern", point)
    _KIND[component] = adapter_.kind


def reach_mixers(bridge: Any, adapters: list[MixerAdapter]) -> None:
    """Give every token mixer of ``bridge``'s blocks that the bridge leaves without the hooks of its kind
    those hook points (see the module docstring). Modules reached before are left as they are; a bridge
    that keeps no hook registry is left as it is (its unhooked mixers are then reported unsupported)."""
    if not isinstance(getattr(bridge, "_hook_registry", None), dict) or not hasattr(bridge, "blocks"):
        return
    blocks = list(bridge.blocks)
    owners: dict[int, set[int]] | None = None
    for i, block in enumerate(blocks):
        hf_block = unwrap(block)
        if hf_block is block:
            continue
        components = _bridge_components(block)
        wrappers = {id(unwrap(c)): (p, c) for p, c in components if unwrap(c) is not c}
        todo: list[tuple[int, torch.nn.Module, MixerAdapter, ReachPlan]] = []
        seen: set[int] = set()
        for _, mod in hf_block.named_modules():
            if mod is hf_block or unwrap(mod) is not mod or _is_hook_point(mod) or isinstance(mod, Reached):
                continue
            if id(mod) in seen:
                continue
            for rank, a in enumerate(adapters):
                plan = a.reach_plan(mod)
                if plan is None:
                    continue
                found = wrappers.get(id(mod))
                if found is None or not all(_hook_at(found[1], h) for h in plan.required):
                    todo.append((rank, mod, a, plan))
                seen.update(id(m) for m in mod.modules())
                break
        for _, mod, a, plan in sorted(todo, key=lambda t: t[0]):  # in detection order of the kinds
            found = wrappers.get(id(mod))
            if found is None and owners is None:
                owners = _param_owners(blocks)
            shared = found is None and any(len(owners.get(id(p), ())) > 1 for p in mod.parameters())  # type: ignore[union-attr]
            _install(bridge, i, block, mod, a, plan, found, shared)
