"""Train the zoo models on KV retrieval (official template) and write checkpoint, tokenizer and model card.

Every zoo model sees the same data: at step ``i`` one dictionary size ``n`` is drawn (uniform over the
recipe's ``pairs`` range, from a :class:`~gna_interp.tasks.seeding.StableRng` stream named by the seed
and ``i``), and the batch is ``KVRetrieval(n, batch_size, seed=data_seed(seed, i), words=zoo_keys())`` --
the project's own task generator, official template, keys from the zoo's key set. Each official prompt
and its answer is followed by more queries, ``queries * n`` in all, keys drawn with replacement (so
answering never reduces to elimination), alternately the line restated (``"\nK2:17"``, the completion
template) and the official question (``"\nThe value of the key 'K2' is 17"``), so one sequence carries
many answers; the evaluated single-query prompt is exactly the prefix of every training sequence.
Under the zoo tokenizer both forms end with the asked key's token, where the answer is predicted; a
restated line costs two tokens, an official question six. The loss is the cross-entropy of every
answer's value token; nothing else in the sequence is trained on (keys and values are random, so it
carries no learnable signal).

What decides whether a d=64 transformer learns retrieval within minutes on CPU (measured while
building the zoo): the token layout of :mod:`gna_interp.zoo.tokenizer` (64 keys; value right after its
key; answer predicted at the asked key), and token embeddings initialised with standard deviation
``embed_std`` = 1 (at ``initializer_range`` 0.1 they are swamped by the first block's output, and
2-layer Llama models stayed at chance even on 2-pair dictionaries). Even so the transformer sits on a
loss plateau for over a thousand steps before retrieval appears abruptly, which sets ``steps``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gna_interp.constants import CARD_MD
from gna_interp.errors import InputError, UnknownModelError
from gna_interp.models.card import CARD_JSON, read_card
from gna_interp.options import Options, options

DEFAULT_EVAL_SIZES: tuple[int, ...] = (5, 8, 10, 20, 40)


@dataclass(frozen=True)
class Recipe:
    """How one zoo model is built and trained.

    ``config`` holds the Hugging Face config arguments (``vocab_size`` and the special-token ids are
    filled in from the tokenizer); ``pairs`` is the inclusive range of training dictionary sizes, and
    ``train_pairs`` (its upper end) the size the acceptance bar refers to.
    """

    name: str
    family: str
    hf_class: str
    config_class: str
    config: dict[str, Any]
    description: str
    steps: int = 3000
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    pairs: tuple[int, int] = (2, 8)
    queries: int = 2
    embed_std: float = 1.0
    seed: int = 0
    threads: int = 1

    @property
    def train_pairs(self) -> int:
        return self.pairs[1]


_D = 64  # width of every zoo model
RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("transformer-kv", "transformer", "LlamaForCausalLM", "LlamaConfig",
           dict(hidden_size=_D, intermediate_size=4 * _D, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=True, initializer_range=0.1),
           "Llama architecture: 2 blocks of RoPE attention (4 heads, d_head 16) + SwiGLU MLP."),
    Recipe("mamba1-kv", "mamba1", "MambaForCausalLM", "MambaConfig",
           dict(hidden_size=_D, state_size=16, num_hidden_layers=4, expand=2, conv_kernel=4,
                tie_word_embeddings=True, use_mambapy=True, initializer_range=0.1),
           "Mamba-1 (S6): 4 blocks, d_inner 128 channels, state 16, conv 4."),
    Recipe("mamba2-kv", "mamba2", "Mamba2ForCausalLM", "Mamba2Config",
           dict(hidden_size=_D, state_size=32, num_hidden_layers=4, expand=2, head_dim=16, num_heads=8,
                n_groups=1, conv_kernel=4, chunk_size=64, tie_word_embeddings=True, initializer_range=0.1),
           "Mamba-2 (SSD): 4 blocks, 8 SSM heads x head_dim 16, state 32, 1 group, conv 4."),
    Recipe("hybrid-kv", "hybrid", "BambaForCausalLM", "BambaConfig",
           dict(hidden_size=_D, intermediate_size=2 * _D, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=4, attn_layer_indices=[2], mamba_n_heads=8, mamba_d_head=16,
                mamba_n_groups=1, mamba_d_state=32, mamba_expand=2, mamba_chunk_size=64,
                max_position_embeddings=512, tie_word_embeddings=True, initializer_range=0.1),
           "Bamba hybrid: 4 blocks, Mamba-2 mixers (8 heads x 16, state 32) in blocks 0, 1, 3 and "
           "RoPE attention (4 heads) in block 2; every block has a SwiGLU MLP (width 128)."),
)}


def recipe(name: str) -> Recipe:
    """The recipe of zoo model ``name``; :class:`UnknownModelError` lists the known names."""
    try:
        return RECIPES[name]
    except KeyError:
        raise UnknownModelError(f"unknown zoo model {name!r}; known zoo models: {sorted(RECIPES)}") from None


def data_seed(seed: int, step: int) -> int:
    """Seed of the :class:`KVRetrieval` batch at ``step`` (disjoint from small evaluation seeds)."""
    return 1_000_000 * (seed + 1) + step


def pairs_at(r: Recipe, step: int) -> int:
    """Dictionary size of the batch at ``step``: uniform over ``r.pairs``, fixed by the seed."""
    from gna_interp.tasks.seeding import StableRng

    lo, hi = r.pairs
    return lo + StableRng("zoo-pairs", r.seed, step).below(hi - lo + 1)


def training_text(sample: Any, extra: Sequence[int]) -> tuple[str, list[int]]:
    """An official KV prompt plus its answer, followed by one more query for each dictionary line in
    ``extra``, alternately the line restated (``"\nK:V"``, the completion template) and the official
    question (``"\nThe value of the key 'K' is V"``); returns the text and the character offset of
    every answer value."""
    lines = [sample.prompt[a:b].rstrip("\n").split(":") for a, b in sample.spans.items]
    key = sample.meta["key"]
    if sample.prompt[sample.cue_start:] != f"The value of the key '{key}' is":
        raise InputError(f"unexpected KV cue {sample.prompt[sample.cue_start:]!r}; the zoo trains on the official template")
    text = sample.prompt + sample.answer
    starts = [len(text) - len(sample.answer.lstrip())]
    for t, i in enumerate(extra):
        k, v = lines[i]
        text += f"\n{k}:{v}" if t % 2 == 0 else f"\nThe value of the key '{k}' is {v}"
        starts.append(len(text) - len(v))
    return text, starts


def training_batch(tokenizer: Any, r: Recipe, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids [batch, pos], positions [q], values [batch, q])`` of ``step``.

    Each sequence is an official-template KV prompt and its answer followed by ``r.queries * n - 1``
    more queries (keys of the same dictionary drawn with replacement). ``values[:, j]`` is the token
    of the ``j``-th answer value, predicted at ``positions[j]`` (that query's last token, the asked
    key); the structure is identical across the batch because every key and value is one token.
    """
    from gna_interp.tasks import KVRetrieval
    from gna_interp.tasks.seeding import StableRng
    from gna_interp.zoo.tokenizer import zoo_keys

    n = pairs_at(r, step)
    q = max(1, r.queries * n)
    task = KVRetrieval(n, r.batch_size, seed=data_seed(r.seed, step), template="official", words=zoo_keys())
    ids, values, where = [], [], None
    for i, s in enumerate(task):
        rng = StableRng("zoo-queries", r.seed, step, i)
        text, starts = training_text(s, [rng.below(n) for _ in range(q - 1)])
        enc = tokenizer(text, return_offsets_mapping=True)
        pos = [next((t for t, (a, _) in enumerate(enc["offset_mapping"]) if a == c), -1) for c in starts]
        if -1 in pos or tokenizer.unk_token_id in enc["input_ids"]:
            raise InputError(f"the zoo tokenizer does not split the answers of {text!r} into known value tokens")
        if where is not None and (pos != where or len(enc["input_ids"]) != len(ids[0])):
            raise InputError("training sequences of one batch tokenised to different structures")
        where = pos
        ids.append(enc["input_ids"])
        values.append([enc["input_ids"][t] for t in pos])
    full = torch.tensor(ids)
    last = max(where)
    return full[:, :last], torch.tensor(where) - 1, torch.tensor(values)


def build_model(r: Recipe, tokenizer: Any) -> torch.nn.Module:
    """A freshly initialised model of recipe ``r`` (seeded with ``r.seed``) sized for ``tokenizer``."""
    import transformers

    cfg = getattr(transformers, r.config_class)(vocab_size=len(tokenizer), **r.config)
    cfg.pad_token_id = cfg.eos_token_id = cfg.bos_token_id = tokenizer.pad_token_id
    torch.manual_seed(r.seed)
    model = getattr(transformers, r.hf_class)(cfg)
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, r.embed_std)
    return model


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """``total`` (tied embeddings counted once) and ``non_embedding`` parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    return {"total": total, "non_embedding": total - emb}


def lr_at(r: Recipe, step: int, steps: int) -> float:
    """Learning rate at ``step`` of ``steps``: linear warmup over ``r.warmup`` steps to ``r.lr``, then cosine
    decay to 10% of it."""
    if step < r.warmup:
        return r.lr * (step + 1) / r.warmup
    frac = (step - r.warmup) / max(1, steps - r.warmup)
    return r.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def make_optimizer(r: Recipe, named: Iterable[tuple[str, torch.nn.Parameter]]) -> torch.optim.AdamW:
    """The zoo's optimizer over the ``(name, parameter)`` pairs ``named``: AdamW(betas=(0.9, 0.98)), weight
    decay ``r.weight_decay`` on matrices (``dim >= 2``), none on vectors."""
    named = list(named)
    decay = [p for _, p in named if p.dim() >= 2]
    no_decay = [p for _, p in named if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": r.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=r.lr, betas=(0.9, 0.98))


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)``; the previous count is restored on exit."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


LossFn = Callable[[torch.nn.Module, Int[Tensor, "batch pos"], Int[Tensor, "q"], Int[Tensor, "batch q"]], Tensor]


def answer_loss(model: torch.nn.Module, inputs: Int[Tensor, "batch pos"], positions: Int[Tensor, "q"],
                values: Int[Tensor, "batch q"]) -> Float[Tensor, ""]:
    """The zoo's training loss: cross-entropy of every answer's value token, predicted at ``positions``."""
    logits = model(input_ids=inputs, logits_to_keep=positions).logits
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), values.flatten())


def fit(model: torch.nn.Module, r: Recipe, tokenizer: Any, loss_fn: LossFn = answer_loss,
        params: Iterable[tuple[str, torch.nn.Parameter]] | None = None, run: "TrainingRun | None" = None,
        **overrides: Any) -> tuple[list[float], float]:
    """Train ``model`` for ``r.steps`` steps on the zoo's data (:func:`training_batch` of ``r``): the
    optimizer of :func:`make_optimizer` over ``params`` (default: every named parameter), learning rate
    :func:`lr_at`, gradients clipped to norm ``r.grad_clip``; ``loss_fn(model, inputs, positions, values)``
    gives each step's loss (default :func:`answer_loss`). ``run`` (:class:`TrainingRun`) or keyword ``overrides``
    of its fields: ``log`` (default ``print``) and ``log_every`` (default 50). Returns the loss per step and the
    wall time (s)."""
    opts = TrainingRun.build(run, **overrides)
    log, log_every = opts.log, 50 if opts.log_every is None else opts.log_every
    named = list(model.named_parameters() if params is None else params)
    trained = [p for _, p in named]
    opt = make_optimizer(r, named)
    model.train()
    losses: list[float] = []
    start = time.perf_counter()
    for step in range(r.steps):
        inputs, positions, values = training_batch(tokenizer, r, step)
        for g in opt.param_groups:
            g["lr"] = lr_at(r, step, r.steps)
        loss = loss_fn(model, inputs, positions, values)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, r.grad_clip)
        opt.step()
        losses.append(loss.item())
        if log and ((step + 1) % log_every == 0 or step + 1 == r.steps):
            recent = losses[-log_every:]
            log(f"  step {step + 1}/{r.steps}  loss {sum(recent) / len(recent):.4f}  "
                f"{time.perf_counter() - start:.0f}s")
    model.eval()
    return losses, time.perf_counter() - start


def save_evaluated(model: torch.nn.Module, tokenizer: Any, out: str | os.PathLike, card: dict[str, Any],
                   run: "TrainingRun | None" = None, sections: Mapping[str, str] | None = None,
                   **overrides: Any) -> dict[str, Any]:
    """Save ``model`` (fp32 safetensors) and ``tokenizer`` to ``out``, measure its KV accuracy there
    (:func:`evaluate_checkpoint`, through ``load_model``, at ``run``'s ``eval_sizes`` and ``eval_samples``:
    a :class:`TrainingRun` or keyword ``overrides`` of its fields) into ``card["evaluation"]`` and write the card
    (with ``sections``, see :func:`render_card`); returns the card."""
    opts = TrainingRun.build(run, **overrides)
    eval_sizes, eval_samples = opts.eval_sizes, opts.eval_samples
    from gna_interp.models.loading import quiet_transformers

    from gna_interp.store import write_files

    model.eval()

    def fill(tmp: Path) -> None:
        with quiet_transformers():
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    out = write_files(out, fill)
    card = {**card, "evaluation": evaluate_checkpoint(out, eval_sizes, eval_samples)}
    write_card(out, card, sections)
    return card


@dataclass
class TrainResult:
    """What :func:`train` did: where it wrote, the card, and the loss curve."""

    out: Path
    card: dict[str, Any]
    losses: list[float] = field(default_factory=list)


@options
class TrainingRun(Options):
    """How a zoo training run (:func:`train`, :func:`~gna_interp.zoo.hybrid_build.build_hybrid`) reports and
    evaluates, apart from what it trains.

    Attributes:
        eval_sizes: dictionary sizes of the card's evaluation; eval_samples: prompts per size.
        threads: torch CPU threads (None: the recipe's for :func:`train`, 1 for ``build_hybrid``).
        log: where progress lines go (None: nowhere); log_every: steps between loss lines (None: the
            function's default, 50 for :func:`train`, 100 for ``build_hybrid``).
    """

    eval_sizes: Sequence[int] = DEFAULT_EVAL_SIZES
    eval_samples: int = 200
    threads: int | None = None
    log: Callable[[str], None] | None = print
    log_every: int | None = None


def train(name: str, out: str | os.PathLike, steps: int | None = None, seed: int | None = None,
          run: TrainingRun | None = None, **overrides: Any) -> TrainResult:
    """Train zoo model ``name`` from scratch on CPU, save it to ``out`` and evaluate it there.

    ``out`` receives ``model.safetensors`` (fp32), ``config.json``, the tokenizer files, ``card.json``
    and ``MODEL_CARD.md``. Accuracy per dictionary size in ``eval_sizes`` is measured with
    :func:`gna_interp.tasks.evaluate` on ``KVRetrieval(n, eval_samples, seed=0)`` after loading the
    saved directory through :func:`gna_interp.load_model`. ``steps``/``seed``/``threads`` override the recipe;
    ``run`` (:class:`TrainingRun`) and keyword ``overrides`` of its fields set the evaluation and the log.
    """
    opts = TrainingRun.build(run, **overrides)
    eval_sizes, eval_samples, threads, log = opts.eval_sizes, opts.eval_samples, opts.threads, opts.log
    log_every = 50 if opts.log_every is None else opts.log_every
    from gna_interp.models.loading import quiet_transformers
    from gna_interp.zoo.tokenizer import build_tokenizer

    r = recipe(name)
    r = replace(r, steps=r.steps if steps is None else steps, seed=r.seed if seed is None else seed,
                threads=r.threads if threads is None else threads)
    if r.steps < 1:
        raise InputError(f"steps must be >= 1, got {r.steps}")
    say = log or (lambda _msg: None)
    with torch_threads(r.threads):
        tokenizer = build_tokenizer()
        with quiet_transformers():
            model = build_model(r, tokenizer)
        counts = parameter_counts(model)
        say(f"{name}: {r.hf_class}, {counts['total']:,} parameters ({counts['non_embedding']:,} non-embedding), "
            f"{r.steps} steps, batch {r.batch_size}, dictionaries {r.pairs[0]}-{r.pairs[1]} pairs, seed {r.seed}")
        losses, wall = fit(model, r, tokenizer, log=log, log_every=log_every)
        card = save_evaluated(model, tokenizer, out, card_for(r, counts, wall, losses), opts)
        say(f"  wrote {out}; accuracy " + ", ".join(f"{k} pairs {v['accuracy']:.3f}"
                                                     for k, v in card["evaluation"]["by_pairs"].items()))
        return TrainResult(Path(out), card, losses)


def card_for(r: Recipe, counts: dict[str, int], wall: float, losses: list[float]) -> dict[str, Any]:
    """The model card (without ``evaluation``) of a model trained with recipe ``r``."""
    import transformers

    from gna_interp.zoo.tokenizer import zoo_keys

    tail = losses[-min(50, len(losses)):]
    return {
        "name": r.name,
        "family": r.family,
        "architecture": r.hf_class,
        "description": r.description,
        "config": r.config,
        "parameters": counts,
        "dtype": "float32",
        "tokenizer": f"word-level (gna_interp.zoo.tokenizer): template words, {len(zoo_keys())} keys, values 0-99",
        "keys": list(zoo_keys()),
        "training": {
            "seed": r.seed, "steps": r.steps, "batch_size": r.batch_size, "lr": r.lr, "warmup": r.warmup,
            "schedule": "linear warmup, cosine decay to 10%", "optimizer": "AdamW(betas=(0.9, 0.98))",
            "weight_decay": r.weight_decay, "grad_clip": r.grad_clip,
            "pairs": list(r.pairs), "train_pairs": r.train_pairs,
            "queries": r.queries,
            "embed_std": r.embed_std,
            "data": "KVRetrieval(n, batch_size, seed=1_000_000*(seed+1)+step, template='official', words=keys); "
                    "n uniform over pairs per step (StableRng('zoo-pairs', seed, step)); each official prompt "
                    "and answer is followed by queries * n - 1 more query lines, keys of the dictionary drawn "
                    "with replacement (StableRng('zoo-queries', seed, step, i)), alternately the line restated "
                    "('\\nK:V', completion template) and the official question",
            "loss": "cross-entropy of every answer's value token, predicted at its query's last token (the asked key) "
                    "(answers only; nothing else in the sequence is trained on)",
            "threads": r.threads, "device": "cpu", "wall_seconds": round(wall, 1),
            "final_loss": round(sum(tail) / len(tail), 4),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
    }


def evaluate_checkpoint(path: str | os.PathLike, sizes: Sequence[int] = DEFAULT_EVAL_SIZES,
                        n_samples: int = 200, seed: int = 0) -> dict[str, Any]:
    """KV accuracy of the checkpoint at ``path`` per dictionary size, via ``load_model`` and ``evaluate``
    (keys from the zoo key set)."""
    from gna_interp.models.loading import load_model
    from gna_interp.tasks import KVRetrieval, evaluate
    from gna_interp.zoo.tokenizer import zoo_keys

    model = load_model(path, device="cpu")
    by_pairs: dict[str, dict[str, float]] = {}
    for n in sizes:
        task = KVRetrieval(n, n_samples, seed=seed, template="official", words=model.kv_words or zoo_keys())
        ev = evaluate(model, task, batch_size=32, progress=False)
        m = ev.metrics
        by_pairs[str(n)] = {"accuracy": round(m["accuracy"], 4), "logit_diff": round(m["logit_diff"], 3),
                            "gold_prob": round(m["gold_prob"], 4), "chance": round(m["chance"], 4)}
    return {"task": "KVRetrieval(n_pairs, n_samples, seed, template='official', words=keys)", "n_samples": n_samples,
            "seed": seed, "scorer": "gna_interp.tasks.evaluate (summed log-prob of each candidate)",
            "by_pairs": by_pairs}


def write_card(out: str | os.PathLike, card: dict[str, Any], sections: Mapping[str, str] | None = None) -> None:
    """Write ``card.json`` and a human-readable ``MODEL_CARD.md`` (with ``sections``, see :func:`render_card`)
    into ``out``."""
    out = Path(out)
    from gna_interp.store import atomic_write

    atomic_write(out / CARD_JSON, json.dumps(card, indent=2) + "\n")
    atomic_write(out / CARD_MD, render_card(card, sections))


def render_card(card: dict[str, Any], sections: Mapping[str, str] | None = None) -> str:
    """The Markdown model card of a ``card.json`` dictionary; ``sections`` (title -> Markdown) are placed
    before ``## Training``; ``card["training"]["reproduce"]``, when present, is the command that rebuilds
    the model (default ``gna zoo train NAME``)."""
    t, ev, p = card["training"], card["evaluation"], card["parameters"]
    extra = "".join(f"## {title}\n\n{text.strip()}\n\n" for title, text in (sections or {}).items())
    reproduce = t.get("reproduce") or f"gna zoo train {card['name']} --steps {t['steps']} --seed {t['seed']}"
    rows = "\n".join(f"| {n} | {v['accuracy']:.3f} | {v['chance']:.3f} | {v['logit_diff']:.2f} | {v['gold_prob']:.3f} |"
                     for n, v in ev["by_pairs"].items())
    cfg = "\n".join(f"- `{k}`: {v}" for k, v in card["config"].items())
    return f"""# zoo:{card['name']}

{card['description']}

- Architecture: `{card['architecture']}` ({card['family']}), load with `gna_interp.load_model("zoo:{card['name']}")`
- Parameters: {p['total']:,} ({p['non_embedding']:,} without the tied embedding), stored as {card['dtype']} safetensors
- Tokenizer: {card['tokenizer']}

{extra}## Training

- Task: KV retrieval, official template, dictionaries of {t['pairs'][0]}-{t['pairs'][1]} pairs
  (training dictionary size {t['train_pairs']}); data: {t['data']}
- Loss: {t['loss']}
- Seed {t['seed']}, {t['steps']} steps, batch {t['batch_size']}, lr {t['lr']} ({t['schedule']}, warmup {t['warmup']}),
  {t['optimizer']}, weight decay {t['weight_decay']}, grad clip {t['grad_clip']}
- Wall time {t['wall_seconds']} s on CPU, {t['threads']} thread(s); final loss {t['final_loss']}
- torch {t['torch']}, transformers {t['transformers']}, Python {t['python']}
- Reproduce: `{reproduce}`

## Accuracy

Measured with `gna_interp.tasks.evaluate` on `KVRetrieval(n_pairs, {ev['n_samples']}, seed={ev['seed']}, words=keys)`
(candidates: the dictionary's values; {ev['scorer']}).

| pairs | accuracy | chance | logit diff | gold prob |
|---|---|---|---|---|
{rows}

## Config

{cfg}
"""
