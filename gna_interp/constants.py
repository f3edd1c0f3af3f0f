"""The file names of the result folders and the bounds on what a run may ask for, each written once.

Every module that reads or writes one of these files, or checks one of these bounds, imports its name from here.
"""

from __future__ import annotations

# ---- a circuit folder (``gna scan --out``, :meth:`Circuit.save`) -----------------------------------------------
CIRCUIT_JSON = "circuit.json"  # the circuit document: written last, it vouches for the others
SCAN_JSON = "scan.json"  # the head scan
SCAN_CSV = "scan.csv"  # one row per head (Circuit.to_frame)
CONTROL_JSON = "control.json"  # the control scan (the task's knowledge twin)
VIEWS_PT = "views.pt"  # the cards' attention views (torch tensors)
DELEGATION_JSON = "delegation.json"  # a hybrid's delegation result
DELEGATION_CSV = "delegation.csv"
SUMMARY_MD = "summary.md"  # written beside them by the report
REPORT_FILE = "report.html"  # a command's HTML page
FIGURES_DIR = "figures"  # the page's figures (PNG), beside it
SCAN_CKPT = "scan.ckpt.json"  # the checkpoint of a scan in progress
CONTROL_SUFFIX = ".control.json"  # a scan checkpoint's control twin: Path(ckpt).with_suffix(CONTROL_SUFFIX)
CONTROL_CKPT = "scan.ckpt.control.json"  # = SCAN_CKPT with CONTROL_SUFFIX

EVAL_SUMMARY_CSV = "eval_summary.csv"  # gna eval's summary table, beside eval.csv

# ---- other commands' results -------------------------------------------------------------------------------
COMPARE_JSON, COMPARE_CSV, COMPARE_MD = "compare.json", "compare.csv", "compare.md"  # gna compare-circuits
PRUNE_JSON, PRUNE_CSV, KEEP_CSV = "prune.json", "prune.csv", "keep.csv"  # gna prune
FAITHFULNESS = "faithfulness"  # the stem of gna circuit's head curve (Faithfulness.write): .json, .csv, .md, .html
FAITHFULNESS_JSON, FAITHFULNESS_CSV = f"{FAITHFULNESS}.json", f"{FAITHFULNESS}.csv"
FAITHFULNESS_MD, FAITHFULNESS_HTML = f"{FAITHFULNESS}.md", f"{FAITHFULNESS}.html"
EDGES_CSV, ROLES_CSV = "edges.csv", "roles.csv"
EDGE_SCREEN_CSV, EDGE_GRAPH_HTML = "edge_screen.csv", "edge_graph.html"
EDGE_FAITHFULNESS = "edge_faithfulness"  # the stem of gna circuit's edge curve: .json, .csv, .md, .html
CIRCUIT_RUN_JSON = "circuit_run.json"  # gna circuit's record of the scan run read, its settings and the stages done
WHOLE_DIR = "whole_circuit"  # gna circuit's folder with the smallest edge circuit in its circuit.json, and its report
PATTERNS_HTML = "patterns.html"  # gna patterns' default page
PATTERNS_PT = "patterns.pt"  # PatternSet.save into a folder
INTERACTIONS_JSON = "interactions.json"  # Interactions.save into a folder
PATH_EFFECTS_JSON = "path_effects.json"  # PathEffects.save into a folder
EVALUATION_JSON = "evaluation.json"  # Evaluation.save into a folder
CALIBRATION_JSON = "calibration.json"  # Calibration.save into a folder


def format_scan(i: int) -> str:
    """The file, in a circuit folder, of the scan on the circuit's ``i``-th extra task format: ``format{i}.json``."""
    return f"format{i}.json"


def result_files(name: str) -> tuple[str, str]:
    """The JSON document and the table of experiment ``name``'s folder (``gna eval``, ``prune``, ``mask``, ``sweep``,
    ``hybrid plan`` ...): ``NAME.json``, ``NAME.csv``."""
    return f"{name}.json", f"{name}.csv"


# ---- model folders -----------------------------------------------------------------------------------------
HF_CONFIG = "config.json"  # a Hugging Face model folder's config
TOKENIZER_CONFIG = "tokenizer_config.json"
CARD_JSON = "card.json"  # a zoo checkpoint's card
CARD_MD = "MODEL_CARD.md"

# ---- bounds ------------------------------------------------------------------------------------------------
MAX_SAMPLES = 100_000  # prompts of one task: far beyond what a scan runs, far below what hangs a machine
MAX_PAIRS = 10_000  # lines of one dictionary (the paper's largest is 50; past this no context holds a prompt)
MAX_VALUE = 10**9  # largest value of a line (a value is a few tokens; past this it is a long number, not a value)
MAX_LINES = 250_000  # dictionary lines of all prompts together (n_pairs x n_samples): about 3 s to build
MAX_SEEDS = 1_000  # random draws: each costs an evaluation of the task
N_BOOTSTRAP = 2000  # resamples of a bootstrap interval unless a caller names another count
N_BOOT_MAX = 100_000  # bootstrap resamples: far past any interval's precision, and a bounded allocation
