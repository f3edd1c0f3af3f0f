"""What ``gna circuit`` measures and writes, stage by stage, into a folder it owns.

The stages: the faithfulness curve of the scan's ranking, the edge table among the circuit's top heads, the screen
of the whole graph, the edge circuits, and the ``whole_circuit`` folder (the scan with the smallest edge circuit
in its circuit.json). Each stage's files are written through :mod:`gna_interp.store` (atomic, never through a
link) as soon as the stage ends, and ``circuit_run.json`` records the scan run read, the settings and the stages
done: an interrupted run resumes with the stages it had (``resume=True``), their files read back before the model
loads; a run whose settings (its model and dtype among them) or scan differ is refused, never mixed with them.

The scan is read once, under its folder's lock, into memory (:class:`ScanSnapshot`): every stage and the
``whole_circuit`` folder use that copy, so a scan folder replaced while the command runs cannot mix into its
results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator

from gna_interp.constants import (CIRCUIT_JSON, CIRCUIT_RUN_JSON, CONTROL_CKPT, EDGE_FAITHFULNESS, EDGE_GRAPH_HTML, EDGE_SCREEN_CSV,
                                  EDGES_CSV, FAITHFULNESS_HTML, FAITHFULNESS_JSON, ROLES_CSV, SCAN_CKPT, WHOLE_DIR)
from gna_interp.errors import GnaError, InputError
from gna_interp.store import as_path, atomic_write, read_json, write_json

if TYPE_CHECKING:
    import pandas as pd

    from gna_interp.circuits.search.circuit import Circuit
    from gna_interp.circuits.edges.edge_screen import EdgeScreen
    from gna_interp.circuits.search.sufficiency import Faithfulness
    from gna_interp.engine.profile import Cost
    from gna_interp.models.model import Model
    from gna_interp.tasks.base import Task

__all__ = ["RUN_JSON", "ScanSnapshot", "Sufficiency", "SufficiencySettings", "check_resume", "run_sufficiency"]

RUN_JSON = CIRCUIT_RUN_JSON
STAGES = ("faithfulness", "edges", "screen", "edge_circuits", "whole")
# the files a finished stage leaves, read back by --resume (the edge circuits' only where one was made)
STAGE_FILES = {"faithfulness": (FAITHFULNESS_JSON,), "edges": (EDGES_CSV, ROLES_CSV), "screen": (EDGE_SCREEN_CSV,),
               "edge_circuits": (f"{EDGE_FAITHFULNESS}.json",)}


@dataclass(frozen=True)
class SufficiencySettings:
    """What ``gna circuit`` measures (its options after ``--quick``, the model spec and dtype it runs); every field
    but ``batch_size`` decides the results, so a run resumes only with the same values."""

    method: str = "mean"
    threshold: float = 0.8
    sizes: tuple[int, ...] | None = None
    samples: int = 0
    seeds: int = 1
    minimality: int = 5
    edges: int = 5
    verify: int = 30
    ig_steps: int = 0
    edge_seeds: int = 0
    edge_precision: float = 0.1
    edge_minimality: int = 4
    batch_size: int = 16
    model: str | None = None
    dtype: str = "float32"

    def key(self) -> dict[str, Any]:
        """The fields that decide the results (all but ``batch_size``), as JSON."""
        out = dataclasses.asdict(self)
        out.pop("batch_size")
        out["sizes"] = list(self.sizes) if self.sizes is not None else None
        return out


@dataclass
class ScanSnapshot:
    """A ``gna scan`` folder read once into memory, under its lock: its files' bytes, its run id and the
    :class:`~gna_interp.circuits.search.circuit.Circuit` loaded from exactly those bytes."""

    path: Path
    files: dict[str, bytes]
    circuit: "Circuit"
    run_id: str

    @classmethod
    def read(cls, path: str | Path) -> "ScanSnapshot":
        """Read the scan folder ``path`` (its result files, not its checkpoints) while holding its lock shared; an
        :class:`InputError` naming the folder, and the command that makes a scan, when it is none, and naming the
        scan's own file (a link, a FIFO, a damaged or mixed file) when one cannot be read."""
        from gna_interp.circuits.search.circuit import Circuit
        from gna_interp.run_folder import reading

        src = as_path(path, "the scan folder")
        if not src.is_dir():
            raise InputError(f"{str(src)!r} is not a folder; gna circuit reads a `gna scan` output folder "
                             f"(make one with `gna scan --out {src}`)")
        if not (src / CIRCUIT_JSON).exists() and not (src / CIRCUIT_JSON).is_symlink():
            raise InputError(f"{str(src)!r} is not a gna scan folder (it has no {CIRCUIT_JSON}); make one with "
                             f"`gna scan --out {src}`, or name the folder a scan wrote")
        _result_files(src)  # checked before the lock is taken: a folder refused is left as it was
        with reading(src):
            files = {f.name: f.read_bytes() for f in _result_files(src)}
        with tempfile.TemporaryDirectory(prefix="gna-scan-") as tmp:
            for name, data in files.items():
                atomic_write(Path(tmp) / name, data)  # a private copy to load from (gone on exit)
            try:
                circuit = Circuit.load(tmp)
                run_id = read_json(Path(tmp) / CIRCUIT_JSON, "circuit")["run_id"]
            except GnaError as e:  # named as the scan's own files, not the private copy's
                raise type(e)(str(e).replace(tmp, str(src))) from None
        return cls(src, files, circuit, run_id)

    def changed(self) -> str | None:
        """The run id the scan folder holds now, when it is no longer the one read (None when unchanged)."""
        try:
            now = read_json(self.path / CIRCUIT_JSON, "circuit")["run_id"]
        except InputError:
            return "unreadable"
        return None if now == self.run_id else now


def _result_files(src: Path) -> list[Path]:
    """The result files of the scan folder ``src`` (not its checkpoints or hidden files); one that is a link or no
    regular file (a FIFO, a folder) is refused, naming it: gna reads a scan's own files, never through a link."""
    out = []
    for f in sorted(src.iterdir()):
        if f.suffix not in (".json", ".pt", ".csv") or f.name in (SCAN_CKPT, CONTROL_CKPT) or f.name.startswith("."):
            continue
        if f.is_symlink() or not f.is_file():
            what = "a symbolic link" if f.is_symlink() else "a folder" if f.is_dir() else "no regular file"
            raise InputError(f"{str(f)!r} is {what}; gna circuit reads a scan's own files, inside its folder: put the "
                             f"file itself there (or rerun `gna scan`)")
        out.append(f)
    return out


@dataclass
class Sufficiency:
    """What ``gna circuit`` found: the node faithfulness curve; the edge table and causal roles of the top heads
    (None when not measured); the whole-graph screen; the edge faithfulness curve with the smallest edge circuit;
    the files written; and what each stage run (not read back) cost (:class:`~gna_interp.engine.profile.Cost`)."""

    faithfulness: "Faithfulness"
    edges: "pd.DataFrame | None" = None
    roles: "pd.DataFrame | None" = None
    screen: "EdgeScreen | None" = None
    edge_faithfulness: "Faithfulness | None" = None
    written: list[Path] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    profile: "dict[str, Cost]" = field(default_factory=dict)

    @classmethod
    def load(cls, folder: str | Path) -> "Sufficiency":
        """What the ``gna circuit`` folder ``folder`` holds: the stages its ``circuit_run.json`` lists as done, each
        read back (an :class:`InputError` naming the file that is gone or damaged)."""
        import pandas as pd

        from gna_interp.circuits.edges.edge_screen import EdgeScreen
        from gna_interp.circuits.search.sufficiency import Faithfulness

        out = as_path(folder, "Sufficiency.load's folder")
        stages = read_json(out / RUN_JSON, "circuit_run").get("stages")
        done = stages if isinstance(stages, dict) else {}
        if "faithfulness" not in done:
            raise InputError(f"{str(out)!r} holds no finished gna circuit stage; run `gna circuit SCAN --out {out}`")
        res = cls(Faithfulness.load(out / FAITHFULNESS_JSON))
        if "edges" in done:
            res.edges, res.roles = pd.read_csv(out / EDGES_CSV), pd.read_csv(out / ROLES_CSV)
        if "screen" in done:
            res.screen = EdgeScreen(pd.read_csv(out / EDGE_SCREEN_CSV), _screen_intact(done["screen"], out))
        if isinstance(done.get("edge_circuits"), dict) and done["edge_circuits"].get("made"):
            res.edge_faithfulness = Faithfulness.load(out / f"{EDGE_FAITHFULNESS}.json")
        return res

    def to_frame(self) -> "pd.DataFrame":
        """The node curve's points and, where measured, the edge curve's, one row each (column ``unit``: heads or
        edges; the rest as :meth:`Faithfulness.to_frame <gna_interp.circuits.search.sufficiency.Faithfulness.to_frame>`)."""
        import pandas as pd

        curves = [c for c in (self.faithfulness, self.edge_faithfulness) if c is not None]
        return pd.concat([c.to_frame().assign(unit=c.unit) for c in curves], ignore_index=True)

    def _repr_html_(self) -> str:
        """Jupyter's display: the node and edge curves' reports' headlines, every text escaped."""
        from gna_interp import html_repr

        lines = [ln[2:] for c in (self.faithfulness, self.edge_faithfulness) if c is not None
                 for ln in c.report().split("\n\n| size")[0].splitlines() if ln.startswith("- ")]
        return html_repr.block([html_repr.title("gna circuit: whether the circuit suffices"),
                                html_repr.bullets(lines)])


class _RunLog:
    """``circuit_run.json``: the scan run read, the settings and the stages done (with what each needs to be read
    back), rewritten as each stage ends."""

    def __init__(self, folder: Path, scan_run: str, settings: SufficiencySettings, resume: bool) -> None:
        self.path = folder / RUN_JSON
        self.body: dict[str, Any] = {"scan_run_id": scan_run, "settings": settings.key(), "stages": {}}
        if resume and self.path.exists():
            doc = read_json(self.path, "circuit_run")
            if doc.get("scan_run_id") != scan_run:
                raise InputError(f"--resume: {str(folder)!r} holds a gna circuit run of another scan (run "
                                 f"{doc.get('scan_run_id')}, the scan read now is run {scan_run}); add --fresh to "
                                 f"start over, or pick another --out")
            theirs = doc.get("settings") if isinstance(doc.get("settings"), dict) else {}
            differ = [f"{k} {theirs.get(k)!r:.40} there, {v!r:.40} now" for k, v in self.body["settings"].items()
                      if theirs.get(k) != v]
            if differ:
                raise InputError(f"--resume: {str(folder)!r} holds a gna circuit run with other options ("
                                 f"{'; '.join(differ)}); rerun with its options, or add --fresh to start over")
            stages, profile = doc.get("stages"), doc.get("profile")
            self.body["stages"] = stages if isinstance(stages, dict) else {}
            if isinstance(profile, dict):
                self.body["profile"] = profile

    def done(self, stage: str) -> dict[str, Any] | None:
        got = self.body["stages"].get(stage)
        return got if isinstance(got, dict) else None

    def mark(self, stage: str, **info: Any) -> None:
        self.body["stages"][stage] = info
        write_json(self.path, "circuit_run", self.body)

    def cost(self, stage: str, cost: "Cost") -> None:
        """Record what ``stage`` cost (``profile`` in ``circuit_run.json``; a resumed run keeps the earlier runs')."""
        self.body.setdefault("profile", {})[stage] = cost.to_dict()
        write_json(self.path, "circuit_run", self.body)


def check_resume(folder: str | Path, scan: ScanSnapshot, settings: SufficiencySettings, resume: bool) -> None:
    """Refuse, before any model loads, a ``resume`` into a folder whose run read another scan or other settings, or
    whose finished stages' files are gone or damaged since (each is read back)."""
    log = _RunLog(Path(folder), scan.run_id, settings, resume)
    for stage, names in STAGE_FILES.items():
        info = log.done(stage)
        if info is None or (stage == "edge_circuits" and not info.get("made")):
            continue
        for name in names:
            _read_back(Path(folder), name, scan)
        if stage == "screen":
            _screen_intact(info, Path(folder))


def _read_back(out: Path, name: str, scan: ScanSnapshot) -> Any:
    """The file ``name`` a finished stage left in ``out``: a faithfulness curve (.json) or a table (.csv; the edge
    table checked for meaning against the scan's heads); an :class:`InputError` naming it when gone or damaged."""
    import pandas as pd

    from gna_interp.circuits.edges.causal import check_edge_table
    from gna_interp.circuits.search.sufficiency import Faithfulness

    path = out / name
    if path.suffix == ".json":
        try:
            return Faithfulness.load(path)
        except InputError as e:
            raise InputError(f"--resume: {e}; add --fresh to start over") from None
    if not path.is_file():  # gone, or a FIFO that a reader would wait on forever
        raise InputError(f"--resume: {str(path)!r}, which a finished stage wrote, is gone or no regular file; add "
                         f"--fresh to start over")
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as e:  # pandas' parser errors are ValueErrors
        raise InputError(f"--resume: {str(path)!r} cannot be read back as a table ({type(e).__name__}: "
                         f"{str(e)[:80]}); add --fresh to start over") from None
    return check_edge_table(frame, scan.circuit.scan.heads, repr(str(path))) if name == EDGES_CSV else frame


def _screen_intact(info: dict[str, Any], out: Path) -> float:
    """The intact metric the screen stage recorded in ``circuit_run.json`` (a finite number, else refused)."""
    value = info.get("intact")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"--resume: {str(out / RUN_JSON)!r} records the screen's intact metric as {value!r:.40}, not "
                         f"a number; add --fresh to start over")
    return float(value)


def run_sufficiency(model: "Model", task: "Task", scan: ScanSnapshot, folder: str | Path,
                    settings: SufficiencySettings, resume: bool = False, say: Callable[[str], Any] = print,
                    stage: Callable[[str], ContextManager[Any]] = lambda label: contextlib.nullcontext()
                    ) -> Sufficiency:
    """Run ``gna circuit``'s stages on ``task`` (the scan's task, or its first samples) and write each stage's files
    into ``folder`` as it ends; with ``resume``, stages that ``folder``'s ``circuit_run.json`` lists as done (for the
    same scan run and settings) are read back instead. ``say`` prints a stage's report, ``stage(label)`` wraps each
    stage (the command line's stage lines). Each stage's cost is measured (:class:`~gna_interp.engine.profile.Meter`)
    and recorded beside it in ``circuit_run.json`` (``profile``). Every stage takes its temporaries from a heap that
    keeps its pages (:func:`~gna_interp.allocator.heap_temporaries`): under the pinned mmap rule the faithfulness
    stage alone faulted 12.7 M pages on SmolLM2 (docs/measurements.md)."""
    from gna_interp.allocator import heap_temporaries
    from gna_interp.engine.profile import Meter
    from gna_interp.engine.replay import shared_prefixes

    out = Path(folder)
    log = _RunLog(out, scan.run_id, settings, resume)
    res = Sufficiency(faithfulness=None)  # type: ignore[arg-type]
    steps = [("faithfulness", _faithfulness), ("edges", _edges), ("screen", _screen),
             ("edge_circuits", _edge_circuits), ("whole", _whole)]
    ctx = _Ctx(model, task, scan, out, settings, log, say, stage)
    with Meter(model) as meter, shared_prefixes():  # one clean pass of each batch, whichever stage replays it
        for name, step in steps:
            resumed = log.done(name) is not None
            if resumed:
                res.resumed.append(name)
            with meter.stage() as cost, heap_temporaries():
                step(ctx, res)
            if not resumed and log.done(name) is not None:  # the stage ran (a stage turned off marks nothing)
                res.profile[name] = cost
                log.cost(name, cost)
    return res


@dataclass
class _Ctx:
    model: Any
    task: Any
    scan: ScanSnapshot
    out: Path
    settings: SufficiencySettings
    log: _RunLog
    say: Callable[[str], Any]
    stage: Callable[[str], ContextManager[Any]]


def _faithfulness(c: _Ctx, res: Sufficiency) -> None:
    from gna_interp.circuits.search.sufficiency import faithfulness
    from gna_interp.viz.faithfulness import faithfulness_curve

    s = c.settings
    if c.log.done("faithfulness") is not None:
        res.faithfulness = _read_back(c.out, FAITHFULNESS_JSON, c.scan)
        c.say(f"faithfulness: read from {c.out / FAITHFULNESS_JSON} (--resume)")
        return
    ranked = c.scan.circuit.scan.top(len(c.scan.circuit.scan.heads))
    with c.stage("faithfulness: every head outside the first k of the ranking ablated"):
        fx = faithfulness(c.model, c.task, ranked, method=s.method, threshold=s.threshold,
                          sizes=list(s.sizes) if s.sizes else None, seeds=s.seeds, minimality=s.minimality,
                          batch_size=s.batch_size)
    c.say(fx.report())
    res.written += fx.write(c.out)
    res.written.append(_figure(c.out / FAITHFULNESS_HTML, faithfulness_curve(
        fx, title=f"{c.model.name}: faithfulness of the scanned circuit")))
    res.faithfulness = fx
    c.log.mark("faithfulness")


def _edges(c: _Ctx, res: Sufficiency) -> None:
    from gna_interp.circuits.edges.causal import causal_roles, measure_edges

    circuit = c.scan.circuit
    if not c.settings.edges:
        if circuit.edges is not None and len(circuit.edges):
            res.roles = causal_roles(circuit.edges, circuit.edge_drops())  # the scan's own edge table
        return
    if c.log.done("edges") is not None:
        res.edges, res.roles = (_read_back(c.out, EDGES_CSV, c.scan), _read_back(c.out, ROLES_CSV, c.scan))
        return
    known = circuit.edges if _same_paths(c) else None
    with c.stage(f"edges among the circuit's first {c.settings.edges} heads (path patching)"):
        res.edges = measure_edges(c.model, c.task, circuit.heads[:c.settings.edges], decision_kv=True,
                                  known=known, batch_size=c.settings.batch_size)
    if known is not None and len(known):
        shared = res.edges["edge"].isin(set(known["edge"])).sum()
        c.say(f"edges: {shared} of {len(res.edges)} read from the scan's edge table (the same prompts, metric and "
              f"zero ablation), the rest measured")
    res.roles = causal_roles(res.edges, circuit.edge_drops())
    for name, frame in ((EDGES_CSV, res.edges), (ROLES_CSV, res.roles)):
        res.written.append(atomic_write(c.out / name, frame.to_csv(index=False)))
    c.log.mark("edges")


def _same_paths(c: _Ctx) -> bool:
    """Whether the scan's edge table measured what the edges stage measures: path patching of the logit difference
    under zero ablation on all of the scan's prompts (a scan of ``zero`` ablation measured its paths so)."""
    scan = c.scan.circuit
    return (scan.edges is not None and scan.scan.method == "zero" and scan.scan.metric in ("logit_diff", "accuracy")
            and list(c.task.samples) == list(scan.load_task().samples))


def _screen(c: _Ctx, res: Sufficiency) -> None:
    from gna_interp.circuits.edges.edge_screen import EdgeScreen, screen_edges
    from gna_interp.progress import quiet
    from gna_interp.viz.edge_graph import edge_graph

    s = c.settings
    if not s.verify:
        return
    done = c.log.done("screen")
    if done is not None:
        res.screen = EdgeScreen(_read_back(c.out, EDGE_SCREEN_CSV, c.scan), _screen_intact(done, c.out))
        return
    with c.stage("the whole graph: edge attribution, then the strongest edges by path patching"):
        res.screen = screen_edges(c.model, c.task, s.method, c.task if s.method == "mean" else None, verify=s.verify,
                                  batch_size=s.batch_size, ig_steps=s.ig_steps,
                                  progress=None if quiet() else lambda line: c.say(line))
    res.written.append(atomic_write(c.out / EDGE_SCREEN_CSV, res.screen.table.to_csv(index=False)))
    res.written.append(_figure(c.out / EDGE_GRAPH_HTML, edge_graph(
        res.screen, title=f"{c.model.name}: the strongest edges of the whole graph")))
    c.log.mark("screen", intact=res.screen.intact)


def _edge_circuits(c: _Ctx, res: Sufficiency) -> None:
    """The edge faithfulness curve -- the edges out of the smallest node circuit's heads first, each part in screen
    order -- and the smallest edge circuit (none, with a line saying why, where the model's blocks do not allow
    edge circuits)."""
    from gna_interp.circuits.search.sufficiency import edge_faithfulness
    from gna_interp.errors import UnsupportedArchitectureError
    from gna_interp.viz.faithfulness import faithfulness_curve

    if res.screen is None:
        return
    done = c.log.done("edge_circuits")
    if done is not None:
        if done.get("made"):
            res.edge_faithfulness = _read_back(c.out, f"{EDGE_FAITHFULNESS}.json", c.scan)
        return
    s = c.settings
    with c.stage("edge circuits: the strongest edges kept in screen order, every other edge ablated"):
        try:
            efx = edge_faithfulness(c.model, c.task, res.screen, method=s.method, threshold=s.threshold,
                                    seeds=s.edge_seeds, minimality=s.edge_minimality, precision=s.edge_precision,
                                    first=res.faithfulness.smallest or None, empty=res.faithfulness.empty,
                                    batch_size=s.batch_size)
        except UnsupportedArchitectureError as e:
            c.say(f"no edge circuit: {e}")
            c.log.mark("edge_circuits", made=False)
            return
    c.say(efx.report().split("\n\n| size")[0])
    res.written += efx.write(c.out, stem=EDGE_FAITHFULNESS)
    res.written.append(_figure(c.out / f"{EDGE_FAITHFULNESS}.html", faithfulness_curve(
        efx, title=f"{c.model.name}: faithfulness of edge circuits")))
    res.edge_faithfulness = efx
    c.log.mark("edge_circuits", made=True)


def _whole(c: _Ctx, res: Sufficiency) -> None:
    """``whole_circuit/``: the scan as read, with the smallest edge circuit as ``whole`` in its circuit.json, and
    its report; built in a new folder beside it, then put in place (nothing where no edge circuit keeps the
    threshold)."""
    from gna_interp.circuits.edges.edge_circuit import whole_circuit
    from gna_interp.report.build import build_report

    efx = res.edge_faithfulness
    if efx is None or (c.log.done("whole") is not None and (c.out / WHOLE_DIR / CIRCUIT_JSON).is_file()):
        return
    role_of = dict(zip(res.roles["name"], res.roles["causal_role"])) if res.roles is not None else {}
    whole = whole_circuit(efx, efx.scores, role_of, c.model.n_layers)
    if whole is None:
        return
    changed = c.scan.changed()
    if changed:
        c.say(f"note: {c.scan.path} changed while gna circuit ran (its run id is now {changed}); "
              f"{WHOLE_DIR}/ holds the scan as it was read, run {c.scan.run_id}, which every stage measured")
    with _new_folder(c.out / WHOLE_DIR) as tmp:
        for name, data in c.scan.files.items():
            atomic_write(tmp / name, data)
        doc = read_json(tmp / CIRCUIT_JSON, "circuit")
        doc["whole"] = whole
        write_json(tmp / CIRCUIT_JSON, "circuit", doc)
        build_report(tmp, png=False)
    res.written += [c.out / WHOLE_DIR / CIRCUIT_JSON, c.out / WHOLE_DIR / "report.html"]
    c.log.mark("whole")


@contextlib.contextmanager
def _new_folder(target: Path) -> Iterator[Path]:
    """A new folder beside ``target`` to fill; on success it replaces ``target`` (a folder gna wrote, or nothing),
    on failure it is removed and ``target`` stays as it was."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        old = None
        if target.is_dir() and not target.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            target.rename(old / target.name)
        tmp.rename(target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _figure(path: Path, fig: Any) -> Path:
    """A plotly figure as a self-contained page at ``path`` (atomic, never through a link)."""
    return atomic_write(path, fig.to_html(include_plotlyjs=True, full_html=True))
