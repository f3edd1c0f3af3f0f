"""The run options every experiment shares: how it writes its folder (:class:`FolderOptions`: ``resume``,
``fresh``, ``png``) and how it computes (:class:`RunOptions`: with ``batch_size`` and ``progress``).

An experiment's config extends them beside :class:`~gna_interp.tasks.options.TaskOptions`
(``SweepConfig(TaskOptions, RunOptions)``, ...), so ``sweep(model, resume=True)`` and ``gna sweep --resume``
name the same option in every experiment.
"""

from __future__ import annotations

from gna_interp.options import Options, options

__all__ = ["FolderOptions", "RunOptions"]


@options
class FolderOptions(Options):
    """How an experiment treats its result folder (``out``).

    Attributes:
        resume: continue from the checkpoint an earlier run left in ``out`` (a checkpoint is never reused or
            thrown away silently: a folder holding one is refused unless ``resume`` or ``fresh`` says what to do).
        fresh: delete that checkpoint and start over.
        png: export the figures as PNG (where export works) beside ``report.html``.
    """

    resume: bool = False
    fresh: bool = False
    png: bool = True


@options
class RunOptions(FolderOptions):
    """How an experiment that runs a model computes, and its folder options (:class:`FolderOptions`).

    Attributes:
        batch_size: sequences a forward.
        progress: show progress bars.
    """

    batch_size: int = 16
    progress: bool = True
