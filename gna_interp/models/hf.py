"""Helpers for the plain Hugging Face modules behind TransformerLens bridge components."""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator

import torch
from torch import Tensor

from gna_interp.errors import GnaError

__all__ = ["bind_args", "quiet_transformers", "unwrap"]


def unwrap(module: Any) -> Any:
    """The plain Hugging Face module behind a TransformerLens bridge component (calling it fires no
    TransformerLens hook); any other module is returned as it is."""
    inner = getattr(module, "original_component", None)
    if not isinstance(inner, torch.nn.Module):
        inner = getattr(module, "_original_component", None)
    return inner if isinstance(inner, torch.nn.Module) else module


def bind_args(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[Tensor, Tensor | None]:
    """``(hidden_states, attention_mask)`` from the arguments of a Hugging Face module's forward."""
    try:
        bound = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    except TypeError:
        bound = dict(kwargs)
        if args:
            bound["hidden_states"] = args[0]
    hidden = bound.get("hidden_states", args[0] if args else None)
    mask = bound.get("attention_mask")
    if not isinstance(hidden, Tensor):
        raise GnaError(f"could not find the hidden states among the arguments of {type(module).__name__}.forward")
    return hidden, mask if isinstance(mask, Tensor) else None


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars and warnings inside the block."""
    import transformers

    was = transformers.utils.logging.is_progress_bar_enabled()
    level = transformers.logging.get_verbosity()
    transformers.utils.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)
        if was:
            transformers.utils.logging.enable_progress_bar()
