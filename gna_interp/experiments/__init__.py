"""The paper's experiments, one module each, as functions that write a result folder.

Each experiment function takes a loaded model (and its options), runs what it needs, and with
``out=DIR`` writes a folder through :class:`~gna_interp.experiments.output.ResultFolder`: a CSV (the
table), a format-versioned JSON (:mod:`gna_interp.store`) and a self-contained ``report.html`` with the
figure (PNGs in ``figures/`` where export works). The ``gna`` subcommand of the same name
(``gna_interp/cli/NAME.py``) parses options and calls it.
"""
