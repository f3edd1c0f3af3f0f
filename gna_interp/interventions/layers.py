"""`skip_layers(model, layers)`: run the model with whole blocks removed (identity on the residual stream).

A skipped block hands its input residual stream on unchanged, whatever its mixer (attention, Mamba-1,
Mamba-2, or a hybrid's block). It is done with two temporary hooks per block on the bridge's
``blocks.{l}.hook_in`` / ``blocks.{l}.hook_out``: the block's output is replaced by its input.
Weights are never touched, and the hooks are removed when the context exits, exception or not.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from jaxtyping import Float
from torch import Tensor

from gna_interp.errors import InputError
from gna_interp.models.model import Model, check_model


def check_layers(model: Model, layers: int | Iterable[int]) -> list[int]:
    """Sorted, distinct block indices; negative ones count from the end. Clear error when out of range."""
    if isinstance(layers, Tensor) and not layers.is_floating_point() and not layers.is_complex():
        layers = layers.tolist()  # an int for a 0-d tensor
    if not isinstance(layers, (int, list, tuple, range, set, frozenset)):
        raise InputError(f"layers must be a layer index or a list of them, got {type(layers).__name__} {layers!r:.40}")
    raw = [layers] if isinstance(layers, int) else list(layers)
    out = set()
    for layer in raw:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise InputError(f"layer indices must be integers, got {layer!r}")
        idx = layer + model.n_layers if layer < 0 else layer
        if not 0 <= idx < model.n_layers:
            raise InputError(f"layer {layer} is out of range: {model.name} has layers 0..{model.n_layers - 1}")
        out.add(idx)
    return sorted(out)


@contextmanager
def skip_layers(model: Model, layers: int | Iterable[int]) -> Iterator[list[int]]:
    """Inside the block, blocks ``layers`` of ``model`` are the identity; yields the resolved indices."""
    check_model(model, runnable=False)
    idx = check_layers(model, layers)
    inputs: dict[int, Tensor] = {}

    def remember(layer: int) -> Any:
        def hook(resid: Float[Tensor, "batch pos d_model"], hook: Any) -> None:
            inputs[layer] = resid

        return hook

    def pass_through(layer: int) -> Any:
        def hook(resid: Float[Tensor, "batch pos d_model"], hook: Any) -> Tensor:
            saved = inputs.pop(layer, None)
            if saved is None or saved.shape != resid.shape:
                raise RuntimeError(f"skip_layers: block {layer}'s input was not seen before its output; "
                                   f"this architecture's blocks cannot be skipped through hook_in/hook_out")
            return saved

        return hook

    hooks = [h for layer in idx for h in ((model.block_input_hook(layer), remember(layer)),
                                          (model.block_output_hook(layer), pass_through(layer)))]
    try:
        with model.hooks(hooks):
            yield idx
    finally:
        inputs.clear()
