"""Tiny random-initialised hybrid models: Zamba2, Nemotron-H and Falcon-H1, saved in Hugging Face format.

The companions of :mod:`gna_interp.models.tiny` for the hybrid families whose mixers TransformerLens
hooks only in part (see :mod:`gna_interp.models.reach`). Each config keeps what makes the family
itself, at a size that runs in milliseconds on a CPU:

- ``zamba2``: 6 layers, hybrid layers 1, 2, 4, 5 with 2 shared attention blocks (block 0 at layers 1
  and 4, block 1 at 2 and 5), per-depth LoRA adapters on the shared q/k/v (``use_shared_attention_adapter``),
  rotary embeddings, Mamba-2 with 2 groups;
- ``nemotron_h``: 5 layers, ``mamba, attention, mlp, mamba, attention``, GQA (4 query / 2 KV heads);
- ``falcon_h1``: 2 parallel-hybrid layers (GQA attention and Mamba-2 side by side), every muP multiplier
  set away from 1, no gated norm in the mixer (``mamba_rms_norm=False``, as the released checkpoints),
  or with it when ``gated_norm=True``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from gna_interp.errors import InputError

HYBRID_FAMILIES = ("zamba2", "nemotron_h", "falcon_h1")

__all__ = ["HYBRID_FAMILIES", "build_tiny_hybrid"]


def _configs(vocab: int, gated_norm: bool) -> dict[str, Callable[[], tuple[Any, Any]]]:
    import transformers as T

    return {
        "zamba2": lambda: (T.Zamba2Config(
            vocab_size=vocab, hidden_size=32, num_hidden_layers=6,
            layers_block_type=["mamba", "hybrid", "hybrid", "mamba", "hybrid", "hybrid"],
            mamba_d_state=8, mamba_expand=2, mamba_ngroups=2, n_mamba_heads=4, chunk_size=16,
            num_attention_heads=4, num_key_value_heads=4, num_mem_blocks=2, use_shared_attention_adapter=True,
            adapter_rank=4, use_mem_rope=True, intermediate_size=64, max_position_embeddings=512),
            T.Zamba2ForCausalLM),
        "nemotron_h": lambda: (T.NemotronHConfig(
            vocab_size=vocab, hidden_size=32, layers_block_type=["mamba", "attention", "mlp", "mamba", "attention"],
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64, ssm_state_size=8,
            mamba_num_heads=4, mamba_head_dim=16, n_groups=2, chunk_size=16, max_position_embeddings=512),
            T.NemotronHForCausalLM),
        "falcon_h1": lambda: (T.FalconH1Config(
            vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2,
            mamba_d_state=8, mamba_chunk_size=16, mamba_rms_norm=gated_norm, max_position_embeddings=512,
            key_multiplier=0.7, attention_in_multiplier=1.3, attention_out_multiplier=0.8,
            ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.05], ssm_in_multiplier=1.2, ssm_out_multiplier=0.9,
            mlp_multipliers=[1.1, 0.9], embedding_multiplier=2.0, lm_head_multiplier=0.5),
            T.FalconH1ForCausalLM),
    }


def build_tiny_hybrid(family: str, path: str | os.PathLike, seed: int = 0, gated_norm: bool = False) -> Path:
    """Write a tiny random-initialised hybrid ``family`` (one of :data:`HYBRID_FAMILIES`) plus a byte
    tokenizer to ``path``; return it. ``gated_norm`` gives Falcon-H1's mixer its gated RMS norm."""
    from gna_interp.models.tiny import byte_tokenizer, save_tiny

    if family not in HYBRID_FAMILIES:
        raise InputError(f"unknown tiny hybrid family {family!r}; choose one of {HYBRID_FAMILIES}")
    tok = byte_tokenizer()
    config, cls = _configs(len(tok), gated_norm)[family]()
    return save_tiny(config, cls, tok, path, seed)
