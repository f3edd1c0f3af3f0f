"""The scan store: where a head scan's progress lives, so a long scan survives an interruption.

A checkpoint is a ``checkpoint`` document (:mod:`gna_interp.store`) holding the scan's state and the
**fingerprint** of its settings (model and weights, dtype, task samples, scoring, ablation method and reference,
head list): a later scan with the same settings resumes from it, skipping finished heads; one with other settings
is refused. It is written atomically after every finished group of heads. Under torchrun each rank writes its own
file beside it (:func:`~gna_interp.circuits.scan.distributed.rank_path`); a resume merges every file it finds, and at
the end rank 0 writes the merged checkpoint and the rank files are removed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from torch import Tensor

from gna_interp.circuits.scan.distributed import Shard, rank_files, rank_path
from gna_interp.circuits.scan.result import HeadScan
from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.store import read_json, write_json
from gna_interp.engine.plan import ScoringPlan

__all__ = ["ScanStore", "fingerprint"]


def fingerprint(model: Model, plan: ScoringPlan, method: str, heads: Sequence[HeadRef], reference: Any) -> str:
    ref = reference
    if ref is not None and hasattr(ref, "prompts"):
        ref = list(ref.prompts)
    if isinstance(ref, Tensor):
        ref = ref.tolist()
    elif ref is not None and hasattr(ref, "ids"):
        ref = ref.ids.tolist()
    first = next(model.hf_model.parameters())
    payload = {  # the dtype too: a resume in another precision would mix two models' numbers
        "model": model.name, "arch": model.architecture, "layers": model.n_layers, "dtype": str(first.dtype),
        "weights": float(first.detach().float().sum()),  # float32: a float64 copy of a 262k-row embedding costs a second
        "task": [[s.prompt, list(s.candidates), s.gold] for s in plan.samples], "scoring": plan.method,
        "method": method, "reference": ref if ref is None or isinstance(ref, (list, str)) else repr(ref),
        "heads": [h.name for h in heads],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _write_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write a checkpoint atomically (see :mod:`gna_interp.store`)."""
    write_json(path, "checkpoint", state, indent=None)


def _read_checkpoint(path: Path, fingerprint: str) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        state = read_json(path, "checkpoint")
    except InputError as e:
        raise InputError(f"checkpoint {str(path)!r} cannot be read: {e}; delete it to start the scan afresh") from e
    if state.get("fingerprint") != fingerprint:
        raise InputError(
            f"checkpoint {str(path)!r} belongs to a different scan (model, task, ablation method, reference or "
            f"head list differ); delete it (gna scan --fresh) or write elsewhere (another --out / checkpoint path)"
        )
    return state


def _merge_states(states: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One checkpoint state from several of the same scan (a single process's and the ranks'): the union of
    their exact and screened heads (first seen first); baseline, estimates, sizes and screening samples
    from the first state that has them."""
    states = [s for s in states if s]
    if not states:
        return None
    out = {**states[0], "exact": {}, "screened": {}}
    for s in states:
        for key in ("exact", "screened"):
            for k, v in (s.get(key) or {}).items():
                out[key].setdefault(k, v)
        for key in ("baseline", "screen_index", "estimates", "sizes"):
            if not out.get(key) and s.get(key):
                out[key] = s[key]
    return out


def _resume_state(path: Path, fingerprint: str, shard: Shard | None) -> tuple[dict[str, Any] | None, bool]:
    """The state to resume from: ``path``'s checkpoint merged with every rank checkpoint beside it (all
    of them this scan's, else :class:`InputError`); under a shard, merged over what every rank sees.
    Also whether rank checkpoints were found."""
    state = _read_checkpoint(path, fingerprint)
    ranks = [_read_checkpoint(f, fingerprint) for f in rank_files(path)]
    if ranks:
        state = _merge_states([state, *ranks])
    if shard is not None:  # a rank may see files the others do not (no shared folder): merge what all saw
        seen = shard.gather((state, bool(ranks)))
        return _merge_states([s for s, _ in seen]), any(r for _, r in seen)
    return state, bool(ranks)


def _finish_checkpoint(scan: HeadScan, path: Path | None, fingerprint: str, shard: Shard | None,
                       merged: bool) -> None:
    """Leave what one process leaves: the whole scan in ``path``, and no rank checkpoints (under a shard
    rank 0 writes it; alone, only when rank checkpoints were merged, which are then deleted)."""
    if path is None or (shard is None and not merged):
        return
    if shard is None or shard.lead:
        _write_checkpoint(path, {"fingerprint": fingerprint, **scan.to_state()})
    if shard is not None:
        shard.barrier()  # the merged checkpoint is written: the rank files are no longer needed
    for f in rank_files(path):
        f.unlink(missing_ok=True)


class ScanStore:
    """The checkpoint of one scan at ``path`` (None: no checkpoint), for the settings whose :func:`fingerprint` is
    ``key``; under a ``shard`` this rank writes its own file beside ``path``."""

    def __init__(self, path: Path | None, key: str, shard: Shard | None = None) -> None:
        self.path, self.key, self.shard, self.merged = path, key, shard, False
        self.own = rank_path(path, shard.rank, shard.world) if shard is not None and path is not None else path

    def resume(self) -> dict[str, Any] | None:
        """The state to continue from (every rank file beside the checkpoint merged in), or None."""
        if self.path is None:
            return None
        state, self.merged = _resume_state(self.path, self.key, self.shard)
        return state

    def save(self, scan: HeadScan) -> None:
        """Write ``scan``'s state into this process's checkpoint file (nothing without a checkpoint)."""
        if self.own is not None:
            _write_checkpoint(self.own, {"fingerprint": self.key, **scan.to_state()})

    def finish(self, scan: HeadScan) -> None:
        """Leave what one process leaves (see :func:`_finish_checkpoint`)."""
        _finish_checkpoint(scan, self.path, self.key, self.shard, self.merged)
