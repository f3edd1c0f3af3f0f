"""The experiment runner: what every experiment of this package does around its own measurements.

An experiment supplies its **points** (a key and how to measure it), and how to **assemble** its result from the
finished points; this module owns the rest, once:

- :func:`model_of`: the model from a spec (or a loaded :class:`~gna_interp.models.model.Model`), checked runnable;
- :func:`resolve_circuit` (:func:`find_circuit` underneath): the circuit whose heads an experiment removes -- given,
  read from a ``gna scan`` folder, found in the run folder by an earlier run, or discovered (:class:`Discovery`);
- :func:`open_folder`: the output folder's up-front rule of ``resume`` / ``fresh`` (a folder holding an earlier run's
  checkpoint is refused unless one of them says what to do) and the clearing ``fresh`` asks for;
- :func:`run_points`: the loop over the points, each skipped when the checkpoint holds it (``resume``), recorded
  in the checkpoint as it finishes, under one progress bar (:func:`progress_bar`).

The chance check is :class:`~gna_interp.tasks.calibration.ChanceVerdict`; the checkpoint is
:class:`~gna_interp.experiments.checkpoint.Checkpoint`; the result folder is
:class:`~gna_interp.experiments.output.ResultFolder`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from gna_interp.constants import CIRCUIT_JSON, CONTROL_CKPT, REPORT_FILE, SCAN_CKPT
from gna_interp.circuits.search.circuit import FILES as CIRCUIT_FILES
from gna_interp.circuits.search.circuit import Circuit
from gna_interp.circuits.search.curve import RANDOM_SALT, curve_k, random_orders
from gna_interp.circuits.search.discovery import discover
from gna_interp.errors import InputError
from gna_interp.experiments.checkpoint import Checkpoint, stale_files
from gna_interp.experiments.options import FolderOptions
from gna_interp.models import load_model
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.tasks.choice import TaskChoice

__all__ = ["Discovery", "Point", "clear_circuit", "find_circuit", "model_of", "open_folder", "progress_bar",
           "random_draws", "removed_k", "resolve_circuit", "run_points", "slug"]


def model_of(model: Model | str | os.PathLike, device: str | None = None, dtype: str = "float32") -> Model:
    """``model`` itself, or the model a spec names (loaded on ``device`` in ``dtype``), checked runnable."""
    m = load_model(model, device=device, dtype=dtype) if isinstance(model, (str, os.PathLike)) else model
    if not isinstance(m, Model):
        raise InputError(f"model must be a Model or a model spec, got {type(model).__name__}")
    m.check_runnable()
    return m


# ---- the circuit ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Discovery:
    """How :func:`find_circuit` discovers a circuit when none is given: ``gna scan``'s default discovery
    (:func:`~gna_interp.circuits.search.discovery.discover`, ``k`` heads in its curve) on ``task`` (a task, a
    :class:`~gna_interp.tasks.choice.TaskChoice`; None: the form ``gna scan`` chooses, seed ``seed + 1``).

    Attributes:
        reuse: load the circuit an earlier run saved in the folder instead of discovering again.
        say: a line printed before discovering (None: nothing).
    """

    seed: int = 0
    task: Any = None
    k: int = 5
    batch_size: int = 16
    progress: bool = True
    allow_chance: bool = False
    reuse: bool = True
    say: str | None = None

    def how(self) -> Any:
        """What :func:`~gna_interp.circuits.search.discovery.discover` runs on."""
        return self.task if self.task is not None else TaskChoice(seed=self.seed + 1, batch_size=self.batch_size)


def find_circuit(model: Model, circuit: Circuit | str | os.PathLike | None, folder: Path | None = None,
                 discovery: Discovery | None = None) -> tuple[Circuit, str]:
    """The circuit and where it came from: ``given`` (a :class:`Circuit`), ``path`` (a ``gna scan`` folder read),
    ``saved`` (found in ``folder`` by an earlier run, when ``discovery.reuse``) or ``discovered`` (with
    ``discovery``, saved in ``folder``; an interrupted discovery resumes from ``folder/scan.ckpt.json``)."""
    if isinstance(circuit, Circuit):
        return circuit, "given"
    if circuit is not None:
        return Circuit.load(circuit), "path"
    how = discovery or Discovery()
    if folder is not None and how.reuse and (folder / CIRCUIT_JSON).exists():
        return Circuit.load(folder), "saved"
    if how.say is not None:
        print(how.say, flush=True)
    found = discover(model, how.how(), k=how.k, batch_size=how.batch_size, allow_chance=how.allow_chance,
                     checkpoint=folder / SCAN_CKPT if folder is not None else None, progress=how.progress)
    if folder is not None:
        found.save(folder)
    return found, "discovered"


def resolve_circuit(model: Model, circuit: Circuit | str | os.PathLike | None, folder: Path | None = None,
                    discovery: Discovery | None = None) -> tuple[Circuit, str]:
    """The circuit whose heads an experiment removes (:func:`find_circuit`), checked to have heads that exist in
    ``model``, and where it came from as a sentence."""
    how = discovery or Discovery()
    found, origin = find_circuit(model, circuit, folder, how)
    name = found.task.get("name")
    if origin == "given":
        src = f"the given circuit (found on {found.model}, task {name})"
    elif origin == "path":
        src = f"the circuit in {Path(circuit)} (found on {found.model}, task {name})"  # type: ignore[arg-type]
    elif origin == "saved":
        src = f"the circuit discovered earlier in {folder} (task {name})"
    else:
        args = found.kv_args
        src = (f"discovered on {name} ({found.task.get('n_samples')} prompts, values 0-{args.get('max_value')}, seed "
               f"{args.get('seed')}; " + ("the form chosen as gna scan chooses it" if how.task is None else
                                          "the given task")
               + ", gna scan's default discovery)" + (f", saved in {folder}" if folder is not None else ""))
    if not found.heads:
        raise InputError(f"{src} has no circuit heads (every scanned head is generic); rerun gna scan with "
                         f"--keep-generic or pick another circuit")
    model.check_heads([h.name for h in found.scan.heads])
    if found.model != model.name:
        src += f"; applied to {model.name}"
    return found, src


def removed_k(circuit: Circuit, k: int) -> int:
    """How many of ``circuit``'s best-ranked heads an experiment removes when asked for ``k``: at most a quarter of
    its scanned heads (:func:`~gna_interp.circuits.search.curve.curve_k`, so that ``k`` random heads stay a small draw) and
    at most the heads of the circuit."""
    return min(curve_k(len(circuit.scan.heads), k), len(circuit.heads))


def clear_circuit(folder: Path) -> None:
    """Delete what :func:`find_circuit` saved in ``folder`` (the circuit files and the scan's checkpoints)."""
    for name in (*CIRCUIT_FILES, SCAN_CKPT, CONTROL_CKPT, REPORT_FILE):
        (folder / name).unlink(missing_ok=True)


def slug(name: str) -> str:
    """A folder name for a model name (``zoo:transformer-kv`` -> ``zoo_transformer-kv``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def random_draws(pool: Sequence[HeadRef], exclude: Sequence[HeadRef], k: int, seeds: int, salt: str = RANDOM_SALT,
                 option: str | None = None) -> list[list[HeadRef]]:
    """``seeds`` random orders of the heads of ``pool`` not in ``exclude`` (seeded by ``salt`` and the seed
    number, the same on every machine; by default the ablation curve's salt, so the same pool draws the curve's
    random heads), each cut to its first ``k``. Too few heads to draw from is refused, naming ``option`` (the setting
    that sets ``k``, e.g. ``--random-k``) as the one to lower when given."""
    others = [h for h in pool if h not in set(exclude)]
    if k > len(others):
        raise InputError(f"cannot draw {k} random heads: only {len(others)} heads are left to draw from once the "
                         f"{len(set(exclude))} removed heads are set aside" + (f"; lower {option}" if option else ""))
    return [order[:k] for order in random_orders(others, seeds, salt)]


# ---- the folder and the points -------------------------------------------------------------------------------
def open_folder(folder: Path | None, ckpt: str, options: FolderOptions, also: Sequence[Path] = (),
                circuits: Sequence[Path] = ()) -> list[Path]:
    """The up-front rule of ``resume`` / ``fresh`` on ``folder`` (:func:`~gna_interp.experiments.checkpoint.stale_files`:
    the checkpoint ``ckpt`` there and the files of ``also``); with ``fresh`` those files are deleted and the circuits
    saved in the folders of ``circuits`` cleared (:func:`clear_circuit`). Returns the files found. Without a folder
    only ``resume`` with ``fresh`` is refused."""
    if folder is None:
        if options.resume and options.fresh:
            raise InputError("resume and fresh exclude each other")
        return []
    stale = stale_files(folder, ckpt, options.resume, options.fresh, also=also)
    if options.fresh:
        for p in stale:
            p.unlink(missing_ok=True)
        for c in circuits:
            clear_circuit(c)
    return stale


def progress_bar(total: int, initial: int, desc: str, progress: bool, unit: str = "point") -> Any:
    """The progress bar of a run of ``total`` points, ``initial`` of them already finished."""
    from gna_interp.progress import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=not progress)


@dataclass(frozen=True)
class Point:
    """One point of an experiment: its checkpoint ``key``, how to ``measure`` it (a JSON-able value) and the
    ``label`` its progress bar shows while it runs (default: the key)."""

    key: str
    measure: Callable[[], Any]
    label: str = ""


def run_points(log: Checkpoint, points: Iterable[Point], desc: str, progress: bool = True, unit: str = "point",
               on_point: Callable[[str, Any], None] | None = None) -> None:
    """Measure, in order, every point of ``points`` that ``log`` does not hold yet, each recorded in ``log`` (and
    its checkpoint file) as it finishes, under one progress bar; ``on_point(key, value)`` after each one recorded.
    A ``measure`` that raises records nothing (a refusal of the point, or an interrupt)."""
    points = list(points)
    done = sum(p.key in log for p in points)
    with progress_bar(len(points), done, desc, progress, unit) as bar:
        for p in points:
            if p.key in log:
                continue
            bar.set_postfix_str(p.label or p.key)
            log.put(p.key, p.measure())
            bar.update(1)
            if on_point is not None:
                on_point(p.key, log[p.key])
