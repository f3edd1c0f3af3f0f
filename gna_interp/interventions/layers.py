"""`LayerSkip` and `skip_layers(model, layers)`: run the model with whole blocks removed (identity on the residual
stream).

A skipped block hands its input residual stream on unchanged, whatever its mixer (attention, Mamba-1,
Mamba-2, or a hybrid's block). It is done with two temporary hooks per block on the bridge's
``blocks.{l}.hook_in`` / ``blocks.{l}.hook_out``: the block's output is replaced by its input.
Weights are never touched, and the hooks are removed when the context exits, exception or not.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Iterator, Mapping

from jaxtyping import Float
from torch import Tensor

from gna_interp.errors import InputError
from gna_interp.interventions.base import Intervention
from gna_interp.models.mixer import Hook
from gna_interp.models.model import Model, check_model


def layer_list(layers: int | Iterable[int]) -> list[int]:
    """``layers`` (an index, a list, tuple, range or set of them, or an integer tensor) as a list of integers, sets
    sorted; a clear error for anything else. Not yet checked against a model (:func:`check_layers`)."""
    if isinstance(layers, Tensor) and not layers.is_floating_point() and not layers.is_complex():
        layers = layers.tolist()  # an int for a 0-d tensor
    if not isinstance(layers, (int, list, tuple, range, set, frozenset)):
        raise InputError(f"layers must be a layer index or a list of them, got {type(layers).__name__} {layers!r:.40}")
    raw = [layers] if isinstance(layers, int) else list(layers)
    for layer in raw:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise InputError(f"layer indices must be integers, got {layer!r}")
    return sorted(raw) if isinstance(layers, (set, frozenset)) else raw


def check_layers(model: Model, layers: int | Iterable[int]) -> list[int]:
    """Sorted, distinct block indices; negative ones count from the end. Clear error when out of range."""
    out = set()
    for layer in layer_list(layers):
        idx = layer + model.n_layers if layer < 0 else layer
        if not 0 <= idx < model.n_layers:
            raise InputError(f"layer {layer} is out of range: {model.name} has layers 0..{model.n_layers - 1}")
        out.add(idx)
    return sorted(out)


@dataclass(frozen=True)
class LayerSkip(Intervention):
    """Whole blocks removed, as a value: each of ``blocks`` (negative indices count from the end) hands its
    input residual stream on unchanged."""

    blocks: tuple[int, ...]
    kind: ClassVar[str] = "layer_skip"

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", tuple(layer_list(self.blocks)))

    def layers(self, model: Model) -> list[int]:
        return check_layers(model, list(self.blocks))

    def hooks(self, model: Model, stack: ExitStack) -> list[Hook]:
        inputs: dict[int, Tensor] = {}
        stack.callback(inputs.clear)

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

        return [h for layer in self.layers(model) for h in ((model.block_input_hook(layer), remember(layer)),
                                                              (model.block_output_hook(layer), pass_through(layer)))]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "layers": list(self.blocks)}

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> "LayerSkip":
        return cls(tuple(fields["layers"]))


@contextmanager
def skip_layers(model: Model, layers: int | Iterable[int]) -> Iterator[list[int]]:
    """Inside the block, blocks ``layers`` of ``model`` are the identity; yields the resolved indices. The same as
    applying ``LayerSkip(layers)`` (:class:`LayerSkip`)."""
    check_model(model, runnable=False)
    idx = check_layers(model, layers)
    with LayerSkip(tuple(idx)).applied(model):
        yield idx
