"""The tiny model zoo: Transformer, Mamba-1, Mamba-2 and hybrid models trained on KV retrieval.

Shipped checkpoints live in sub-folders of this package (``zoo/transformer-kv/`` ...) and load with
``gna_interp.load_model("zoo:transformer-kv")``. :func:`train` rebuilds one from its recipe and seed;
:func:`build_tokenizer` is the word-level tokenizer saved with each checkpoint; :func:`build_hybrid`
distils the zoo Transformer into a retrieval-guided hybrid (``zoo:hybrid-guided-kv``).
"""

from gna_interp.models import zoo_dir, zoo_names
from gna_interp.zoo.hybrid_build import HybridConfig, build_hybrid
from gna_interp.zoo.tokenizer import build_tokenizer, vocabulary
from gna_interp.zoo.training import (
    DEFAULT_EVAL_SIZES,
    RECIPES,
    Recipe,
    TrainingRun,
    TrainResult,
    build_model,
    evaluate_checkpoint,
    read_card,
    recipe,
    render_card,
    train,
    training_batch,
    write_card,
)

__all__ = ["DEFAULT_EVAL_SIZES", "HybridConfig", "RECIPES", "Recipe", "TrainResult", "TrainingRun", "build_hybrid", "build_model",
           "build_tokenizer", "evaluate_checkpoint", "read_card", "recipe", "render_card", "train", "training_batch",
           "vocabulary", "write_card", "zoo_dir", "zoo_names"]
