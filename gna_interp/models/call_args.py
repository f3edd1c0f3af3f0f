"""Checks of the arguments of :class:`~gna_interp.models.model.Model`'s TransformerLens-style calls (``to_tokens``,
``model(...)``, ``run_with_hooks``, ``run_with_cache``, ``generate``), each raising :class:`InputError` (or
:class:`OptionError`) before any forward runs, with a message that names the argument, its value and what to do.
"""

from __future__ import annotations

import difflib
import numbers
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from gna_interp.errors import InputError, OptionError

Hooks = Sequence[tuple[Any, Callable[..., Any]]]

# keywords that reach the bridge's forward (the rest of a call's keywords are refused, see check_keywords)
FORWARD_KEYWORDS = ("return_type", "loss_per_token", "attention_mask", "stop_at_layer", "logits_to_keep",
                    "use_cache", "past_key_values")
TEXT_KEYWORDS = ("prepend_bos", "padding_side")
HOOK_KEYWORDS = ("reset_hooks_end", "clear_contexts", "remove_batch_dim")
CACHE_KEYWORDS = (*HOOK_KEYWORDS, "return_cache_object", "pos_slice", "incl_bwd", "device")
RETURN_TYPES = ("logits", "loss", "both", "logits_and_cache", None)
_FLAGS = ("clear_contexts", "remove_batch_dim", "return_cache_object", "incl_bwd", "loss_per_token")


def check_keywords(call: str, given: Mapping[str, Any], accepted: Iterable[str], elsewhere: str | None = None) -> None:
    """Raise :class:`OptionError` naming the first keyword of ``given`` that ``call`` does not take, its value, the
    closest accepted one and where TransformerLens's other options live (``elsewhere``, default
    ``model.bridge.CALL(...)``)."""
    accepted = sorted(accepted)
    unknown = sorted(set(given) - set(accepted))
    if not unknown:
        return
    name = unknown[0]
    close = difflib.get_close_matches(name, accepted, 1)
    hint = f"; did you mean {close[0]!r}?" if close else "."
    raise OptionError(f"{call} takes no keyword {name!r} (got {name}={given[name]!r:.60}){hint} It takes "
                      f"{', '.join(accepted)}; for TransformerLens's other options call "
                      f"{elsewhere or f'model.bridge.{call}(...)'} on the bridge itself")


def check_flag(name: str, value: Any, optional: bool = False) -> None:
    """Raise :class:`InputError` unless ``value`` is a bool (or None, when ``optional``)."""
    if isinstance(value, bool) or (optional and value is None):
        return
    allowed = "True, False or None" if optional else "True or False"
    raise InputError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__}): pass the bool itself, "
                     f"e.g. {name}=False")


def check_padding_side(value: Any) -> None:
    """Raise :class:`InputError` unless ``value`` is ``'left'``, ``'right'`` or None."""
    if value is None or (isinstance(value, str) and value in ("left", "right")):
        return
    raise InputError(f"padding_side must be 'left', 'right' or None (left), got {value!r}: pass padding_side='left' "
                     f"or padding_side='right'")


def check_return_type(value: Any) -> None:
    """Raise :class:`InputError` unless ``value`` is a ``return_type`` a Model's runs take."""
    if value is None or (isinstance(value, str) and value in RETURN_TYPES):
        return
    raise InputError(f"return_type must be 'logits', 'loss', 'both', 'logits_and_cache' or None, got {value!r}")


def check_forward_options(kwargs: Mapping[str, Any], n_layers: int) -> None:
    """Check the forward's keywords among ``kwargs`` that the bridge would take without a word: ``stop_at_layer``
    an integer naming a block (``-n_layers .. n_layers - 1``; a float or a block past the last would run the whole
    model and return logits), ``logits_to_keep`` a count >= 0 or a tensor, ``use_cache`` a bool."""
    stop = kwargs.get("stop_at_layer")
    if stop is not None and (isinstance(stop, bool) or not isinstance(stop, numbers.Integral)
                             or not -n_layers <= stop < n_layers):
        raise InputError(f"stop_at_layer must be None or an integer in {-n_layers}..{n_layers - 1} (the block to stop "
                         f"before: 0 returns the embeddings, -1 the residual entering the last block), got {stop!r:.40}; "
                         f"for the residual after the last block use model.final_residual(...)")
    keep = kwargs.get("logits_to_keep")
    if keep is not None and not isinstance(keep, Tensor) and (
            isinstance(keep, bool) or not isinstance(keep, numbers.Integral) or keep < 0):
        raise InputError(f"logits_to_keep must be a count >= 0 (0: every position; k: the last k) or a tensor of "
                         f"positions, got {keep!r:.40}")
    if "use_cache" in kwargs:
        check_flag("use_cache", kwargs["use_cache"], optional=True)


def check_cache_options(kwargs: Mapping[str, Any], n_pos: int) -> None:
    """Check ``run_with_cache``'s ``device`` (a torch device this machine has) and ``pos_slice`` (what
    TransformerLens's ``Slice`` takes, selecting positions among the input's ``n_pos``) among ``kwargs``."""
    from transformer_lens.utilities.slice import Slice

    device = kwargs.get("device")
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError, ValueError):
            raise InputError(f"device={device!r:.40} is not a torch device: pass 'cpu', 'cuda' or 'cuda:N'") from None
        count = torch.cuda.device_count() if dev.type == "cuda" and torch.cuda.is_available() else 0
        if dev.type == "cuda" and (dev.index or 0) >= count:
            raise InputError(f"device={device!r}: this machine has {count} CUDA device(s) torch can use; the cache "
                             f"can go to 'cpu'" + (f" or cuda:0..cuda:{count - 1}" if count else ""))
    if kwargs.get("pos_slice") is None:
        return
    value = kwargs["pos_slice"]
    try:
        cut = value if isinstance(value, Slice) else Slice(value)
        cut.apply(torch.arange(n_pos))
    except (IndexError, TypeError, ValueError) as e:
        raise InputError(f"pos_slice={value!r:.60} selects no positions of the input's {n_pos} ({e}): pass an int, a "
                         f"(start, stop[, step]) tuple, a slice or a list of positions within them") from None


def check_hooks(name: str, hooks: Any, hook_names: Callable[[], Collection[str]]) -> list[tuple[Any, Callable[..., Any]]]:
    """``hooks`` (``fwd_hooks`` / ``bwd_hooks``) as a list of ``(hook name, function)`` pairs, each name a hook of
    the model (one of ``hook_names()``, asked only when a name is given) or a function ``name -> bool`` choosing
    hooks, as TransformerLens takes them; raise :class:`InputError` naming the pair for anything else (one pair not
    in a list, a name that is no hook)."""
    pairs = list(hooks) if isinstance(hooks, Iterable) and not isinstance(hooks, (str, bytes, Mapping)) else None
    if pairs and len(pairs) == 2 and isinstance(pairs[0], str) and callable(pairs[1]):
        raise InputError(f"{name} is a list of (hook name, function) pairs, got one pair: pass {name}=[({pairs[0]!r}, "
                         f"fn)]")
    if pairs is None:
        raise InputError(f"{name} must be a list of (hook name, function) pairs, got {type(hooks).__name__} "
                         f"{hooks!r:.60}")
    known: Collection[str] | None = None
    for pair in pairs:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and callable(pair[1])
                and (isinstance(pair[0], str) or callable(pair[0]))):
            raise InputError(f"{name} must be a list of (hook name, function) pairs, got the item {pair!r:.80}: each "
                             f"is a hook name (or a function name -> bool) and a function (tensor, hook) -> tensor")
        if not isinstance(pair[0], str):
            continue
        known = hook_names() if known is None else known
        if pair[0] not in known:
            close = difflib.get_close_matches(pair[0], list(known), 1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InputError(f"{name} names {pair[0]!r}, which is no hook of this model{hint}: the hook names are "
                             f"model.bridge.hook_dict's keys")
    return [tuple(p) for p in pairs]  # type: ignore[misc]


def check_run_options(kwargs: Mapping[str, Any]) -> None:
    """Check the hook and cache options of ``run_with_hooks`` / ``run_with_cache`` among ``kwargs``: the flags are
    bools, ``reset_hooks_end`` is True (a Model keeps no hook between runs) and ``incl_bwd`` asks for a scalar
    loss (its backward pass starts there) of a whole forward (no ``stop_at_layer``)."""
    for name in _FLAGS:
        if name in kwargs:
            check_flag(name, kwargs[name])
    if kwargs.get("incl_bwd") and kwargs.get("stop_at_layer") is not None:
        raise InputError(f"incl_bwd=True runs backward() from the loss, and stop_at_layer="
                         f"{kwargs['stop_at_layer']!r:.20} ends the forward before it: leave one of them out")
    if kwargs.get("reset_hooks_end", True) is not True:
        raise InputError(f"reset_hooks_end={kwargs['reset_hooks_end']!r}: a Model keeps no hook after its run. Leave "
                         f"it out; to keep hooks over several runs use a with-block: with model.hooks([(name, fn)]): "
                         f"...; backward hooks (bwd_hooks) fire at backward() without it")
    if kwargs.get("incl_bwd") and (kwargs.get("return_type") != "loss" or kwargs.get("loss_per_token")):
        raise InputError(f"incl_bwd=True runs backward() from the output, which must be the scalar loss: pass "
                         f"return_type='loss' (got return_type={kwargs.get('return_type', 'logits')!r}"
                         f"{', loss_per_token=True' if kwargs.get('loss_per_token') else ''})")


def check_names_filter(value: Any, hook_names: Collection[str]) -> Any:
    """``names_filter`` as the bridge takes it: None, a hook name, a list of names (a tuple becomes a list) or a
    callable ``name -> bool``. Raise :class:`InputError` for anything else, and for a name that is no hook of the
    model (``hook_names``), naming the closest one."""
    if value is None or (callable(value) and not isinstance(value, str)):
        return value
    names = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if names is None or not all(isinstance(n, str) for n in names):
        raise InputError(f"names_filter must be None, a hook name, a list of hook names or a function name -> bool, "
                         f"got {value!r:.60} ({type(value).__name__}): e.g. names_filter='blocks.0.attn.hook_pattern' "
                         f"or names_filter=lambda name: name.endswith('hook_pattern')")
    for name in names:
        if name not in hook_names:
            close = difflib.get_close_matches(name, list(hook_names), 1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InputError(f"names_filter names {name!r}, which is no hook of this model{hint}: the hook names are "
                             f"model.bridge.hook_dict's keys")
    return value if isinstance(value, str) else names


def check_loss_rows(return_type: Any, mask: Tensor, packed: bool) -> None:
    """For ``return_type`` ``'loss'`` / ``'both'``: raise :class:`InputError` for a packed batch (its rows hold
    several continuations, no single next-token sequence) and for a row with fewer than 2 real tokens (``mask``
    1 = real token), which has no token to predict."""
    if return_type not in ("loss", "both"):
        return
    if packed:
        raise InputError(f"return_type={return_type!r} is a next-token loss, and a packed batch (a tree mask) holds "
                         f"several continuations per row: pass the prompts as separate rows, or take the logits")
    lengths = mask.sum(1).tolist()
    short = [k for k, n in enumerate(lengths) if n < 2]
    if short:
        where = "the input has" if len(lengths) == 1 else f"row {short[0]} has"
        raise InputError(f"return_type={return_type!r} averages the loss of predicting each token from the ones "
                         f"before it, so it needs at least 2 tokens per row; {where} {int(lengths[short[0]])}: pass "
                         f"longer text, or take the logits (return_type='logits')")


def gradient_hooks(bwd_hooks: Hooks) -> list[tuple[Any, Callable[..., Any]]]:
    """Forward hooks that attach each ``(name, fn)`` of ``bwd_hooks`` to its hook point's output tensor
    (``Tensor.register_hook``): at ``backward()`` -- after the run and its hooks are gone -- ``fn(grad, hook=hook)``
    is called with the gradient there, and a tensor it returns replaces that gradient, as TransformerLens's
    backward hooks do. A hook point whose output needs no gradient (the token ids) gets no call."""
    if isinstance(bwd_hooks, (str, bytes)) or not all(
            isinstance(h, (tuple, list)) and len(h) == 2 and callable(h[1]) for h in bwd_hooks):
        raise InputError(f"bwd_hooks must be a list of (hook name, function) pairs, got {bwd_hooks!r:.80}")

    def attach(fn: Callable[..., Any]) -> Callable[..., Any]:
        def on_output(x: Any, hook: Any = None) -> Any:
            if isinstance(x, Tensor) and x.requires_grad:
                x.register_hook(lambda grad: fn(grad, hook=hook))
            return x
        return on_output

    return [(name, attach(fn)) for name, fn in bwd_hooks]


def check_new_tokens(max_new_tokens: Any, prompt_tokens: int, n_ctx: int, model_name: str) -> None:
    """Raise :class:`InputError` unless ``max_new_tokens`` is an int >= 0 and a prompt of ``prompt_tokens`` tokens
    plus that many new ones fits the context ``n_ctx`` (0: unknown, anything fits)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
        raise InputError(f"max_new_tokens must be a whole number >= 0, got {max_new_tokens!r} "
                         f"({type(max_new_tokens).__name__})")
    if max_new_tokens < 0:
        raise InputError(f"max_new_tokens must be >= 0, got {max_new_tokens}: pass the number of tokens to generate "
                         f"(0 returns the prompt)")
    if n_ctx and prompt_tokens + max_new_tokens > n_ctx:
        raise InputError(f"the prompt is {prompt_tokens} tokens and max_new_tokens={max_new_tokens}: together they "
                         f"exceed {model_name}'s context of {n_ctx} tokens; the largest max_new_tokens for this "
                         f"prompt is {n_ctx - prompt_tokens}")
