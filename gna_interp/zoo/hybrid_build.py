"""Build a retrieval-guided hybrid: distil a zoo Transformer into Mamba-2 heads plus the attention heads kept.

The paper's hybrid (Bick, Xing & Gu 2025) keeps the few attention heads a KV-retrieval scan ranks highest
and replaces every other head with Mamba-2. :func:`build_hybrid` does that at zoo scale, on CPU:

**The student is a real Falcon-H1** (``FalconH1ForCausalLM``, loaded and analysed by gna_interp like any
hybrid). A Falcon-H1 layer runs attention and a Mamba-2 mixer *in parallel* on the same normed input and
adds both outputs to the residual stream, then a SwiGLU MLP -- with every muP multiplier at 1 that is the
teacher's Llama layer (``x + attn(norm(x))``, then ``h + mlp(norm(h))``) with a Mamba-2 mixer beside the
attention. Why Falcon-H1 and not the alternatives, checked against transformers 5:

- **Bamba** / **Jamba** / **Zamba2** choose *per layer* between attention and Mamba (or share one attention
  block): they cannot keep one head of a layer and replace its other heads;
- **Nemotron-H** attention layers have no rotary embedding and its MLP is a non-gated ReLU^2: the teacher's
  RoPE heads and SwiGLU MLPs would not carry over;
- **Falcon-H1** keeps RoPE attention (same ``apply_rotary_pos_emb``, scaling ``d_head^-1/2``), RMSNorm and a
  SwiGLU MLP of the Llama form, so embeddings, norms, MLPs and the kept heads' q/k/v/o slices copy over
  exactly (:func:`transplant`; with every teacher head kept and the Mamba output projection at zero the
  student's logits equal the teacher's).

**Head slots.** Falcon-H1 has one attention width for every layer, so the student has ``slots`` = the
most heads kept in any layer (at least 1; ``num_key_value_heads = slots``: each slot gets its own key/value
head, the kept head's own, or under grouped-query attention the one it reads). Kept head ``t`` of layer
``l`` (ascending) sits in slot ``t``; the card's ``hybrid.slots`` maps student ``L{l}H{t}`` to the teacher
head. A slot no kept head fills (a layer with fewer kept heads, every slot of a build that keeps none) is
**unused**: its q/k/v rows and o_proj columns are zero and stay exactly zero through training (their
gradients are masked; AdamW leaves a zero weight with zero gradient at zero). gna_interp lists an unused
slot as an attention head, but its output is identically zero, so ablating it changes nothing and a scan
gives it a drop of exactly 0 -- it can never rank as a kept head; the card lists the unused slots by name.

**The Mamba-2 mixers** are the same in every layer and in every build (``mamba_heads`` heads of
``mamba_head_dim`` channels, by default 4 x 16 = the teacher's attention width), so builds that keep
different heads differ only in those heads. They start from Falcon-H1's initialisation, except that
``ssm_init="zero"`` (default) zeroes the output projection: the untrained student is then exactly the
teacher with every head not kept zero-ablated, and distillation grows the SSM path from there.

**Training** is :func:`gna_interp.zoo.training.fit` (the zoo's AdamW, warmup + cosine schedule, gradient
clipping, :func:`~gna_interp.zoo.training.training_batch` data of the teacher's recipe) with a
distillation loss (``loss``): ``kl`` -- KL(teacher || student) of the next-token distributions at every
position of the training sequences; ``kl_answers`` -- the same at the answer positions only; ``ce`` --
the zoo's cross-entropy of the answers; ``kl+ce`` -- the sum of ``kl`` and ``ce``. By default
(``train_teacher_parts=False``) only the Mamba-2 mixers train: the kept heads, MLPs, norms and embeddings
stay the teacher's, so builds that keep different heads differ in nothing but which of the teacher's heads
they keep. The saved folder is a zoo checkpoint (weights, tokenizer, ``card.json``, ``MODEL_CARD.md``),
loadable with ``load_model``.

Measured on ``zoo:transformer-kv`` while choosing the defaults (300 steps, seed 0, 100 prompts per size,
accuracy at 5/8/10/20/40 pairs; the teacher scores 1.00/0.99/0.99/0.91/0.57 and with only its top-2 heads
L0H3, L1H3 0.81/0.92/0.83/0.72/0.36): with every part trained, any kept attention head can be retrained
into a retrieval head (2 random heads L0H1, L1H2: 0.98/0.99/0.94/0.65/0.27) while the top heads drift
(0.98/0.98/0.97/0.86/0.44); with the teacher's parts frozen the top-2 student keeps more
(0.99/0.99/0.99/0.93/0.49; 600 steps 1.00/0.99/0.99/0.93/0.53) and the random one must get retrieval from
its Mamba-2 mixers (0.36/0.31/0.19/0.12/0.05). The four losses gave the same top-2 student within 0.01 at
every size (frozen parts), and none taught the Mamba-2-only student retrieval in 300 steps (``kl``
0.17/0.22/0.10/0.05/0.01, ``ce`` 0.17/0.19/0.07/0.03/0.04); ``kl`` is the default, as distillation
proper (it also matches the teacher where no answer is asked).
"""

from __future__ import annotations

import os
import random
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gna_interp.errors import HeadError, InputError, OptionError
from gna_interp.models.heads import HeadRef
from gna_interp.options import Options, check_choice, check_int, options
from gna_interp.zoo.training import (
    DEFAULT_EVAL_SIZES,
    Recipe,
    TrainingRun,
    TrainResult,
    build_model,
    card_for,
    fit,
    parameter_counts,
    recipe,
    save_evaluated,
    torch_threads,
)

if TYPE_CHECKING:
    from gna_interp.models.model import Model

LOSSES = ("kl", "kl_answers", "ce", "kl+ce")
SSM_INITS = ("zero", "random")
SUPPORTED_TEACHERS = ("LlamaForCausalLM",)

__all__ = ["HybridConfig", "HybridRun", "LOSSES", "Layout", "build_hybrid", "distill_loss", "is_attention", "layout",
           "random_heads", "student_recipe", "transplant", "unused_masks"]


@options
class HybridConfig(Options):
    """How :func:`build_hybrid` builds and trains the student.

    Attributes:
        steps, lr, warmup, batch_size: training length and schedule (the zoo's AdamW, warmup + cosine
            decay to 10%).
        loss: ``kl`` (all positions), ``kl_answers``, ``ce`` (answers' cross-entropy) or ``kl+ce``.
        mamba_heads, mamba_head_dim, mamba_state, mamba_groups, mamba_conv, mamba_chunk: every layer's
            Mamba-2 mixer.
        ssm_init: ``zero`` (Mamba output projection zeroed: the untrained student is the teacher with the
            other heads zero-ablated) or ``random`` (Falcon-H1's own initialisation).
        train_teacher_parts: also train the parts copied from the teacher (embeddings, norms, MLPs, kept
            heads); False trains the Mamba-2 mixers only.
    """

    steps: int = 600
    lr: float = 3e-3
    warmup: int = 50
    batch_size: int = 32
    loss: str = "kl"
    mamba_heads: int = 4
    mamba_head_dim: int = 16
    mamba_state: int = 32
    mamba_groups: int = 1
    mamba_conv: int = 4
    mamba_chunk: int = 64
    ssm_init: str = "zero"
    train_teacher_parts: bool = False

    def validate(self) -> None:
        for name, low in (("steps", 1), ("warmup", 0), ("batch_size", 1), ("mamba_heads", 1), ("mamba_head_dim", 1),
                          ("mamba_state", 1), ("mamba_groups", 1), ("mamba_conv", 2), ("mamba_chunk", 1)):
            check_int(name, getattr(self, name), low)
        check_choice("loss", self.loss, LOSSES)
        check_choice("ssm_init", self.ssm_init, SSM_INITS)
        if self.mamba_heads % self.mamba_groups:
            raise OptionError(f"mamba_heads ({self.mamba_heads}) must be a multiple of mamba_groups "
                              f"({self.mamba_groups})")
        if not isinstance(self.lr, (int, float)) or not self.lr > 0:
            raise OptionError(f"lr must be a positive number, got {self.lr!r}")


# ---- which teacher head sits where ----------------------------------------------------------------


def is_attention(head: HeadRef) -> bool:
    """Whether ``head`` is a softmax attention head (its kind's adapter says so): the heads a hybrid keeps."""
    return head.adapter.normalized_rows


class Layout:
    """Where the kept teacher heads sit in the student: ``kept[l]`` are layer ``l``'s kept teacher heads
    (ascending), in slots ``0..len(kept[l]) - 1``; every layer has ``slots`` attention slots."""

    def __init__(self, n_layers: int, n_heads: int, keep: Sequence[HeadRef]) -> None:
        self.n_layers, self.n_heads = n_layers, n_heads
        self.keep = sorted(keep)
        self.kept: list[list[int]] = [[h.head for h in self.keep if h.layer == layer] for layer in range(n_layers)]
        self.slots = max(1, max(len(k) for k in self.kept))

    def slot_map(self) -> dict[str, str]:
        """Student head name -> teacher head name, for the kept heads."""
        return {HeadRef(layer, t).name: HeadRef(layer, h).name
                for layer, heads in enumerate(self.kept) for t, h in enumerate(heads)}

    def unused(self) -> list[HeadRef]:
        """The student's attention slots that hold no kept head (output identically zero)."""
        return [HeadRef(layer, t) for layer in range(self.n_layers) for t in range(len(self.kept[layer]), self.slots)]


def layout(teacher: "Model", keep: Sequence[HeadRef | str]) -> Layout:
    """Validate ``keep`` (attention heads of ``teacher``, a Llama zoo model, each once) and place them in
    student slots."""
    cfg = _check_teacher(teacher)
    if isinstance(keep, (str, HeadRef)) or not isinstance(keep, Sequence):
        raise InputError(f"keep must be a list of attention heads of the teacher (e.g. ['L0H3', 'L1H3'], or [] to keep "
                         f"none), got {keep!r}")
    try:
        heads = teacher.check_heads(list(keep)) if keep else []
    except HeadError as e:
        raise InputError(f"keep: {e}") from e
    bad = [h.name for h in heads if not is_attention(h)]
    if bad:
        raise InputError(f"keep names {', '.join(bad)}, not attention heads; a hybrid keeps attention heads of the "
                         f"teacher (names like L0H3)")
    dup = sorted({h.name for h in heads if heads.count(h) > 1})
    if dup:
        raise InputError(f"keep lists {', '.join(dup)} more than once; name each kept head once")
    return Layout(cfg.num_hidden_layers, cfg.num_attention_heads, heads)


def random_heads(teacher: "Model", k: int, seed: int) -> list[HeadRef]:
    """``k`` attention heads of ``teacher`` drawn uniformly without replacement (``random.Random`` seeded
    with ``hybrid-random-{seed}``: the same draw on every machine), in head order."""
    pool = [h for h in teacher.heads() if is_attention(h)]
    check_int("k", k, 0)
    if k > len(pool):
        raise InputError(f"cannot keep {k} random heads: {teacher.name} has {len(pool)} attention heads")
    return sorted(random.Random(f"hybrid-random-{seed}").sample(pool, k))


# ---- the student ----------------------------------------------------------------------------------


def _check_teacher(teacher: "Model") -> Any:
    hf = teacher.hf_model
    cfg = hf.config
    arch = type(hf).__name__
    if arch not in SUPPORTED_TEACHERS:
        raise InputError(f"build_hybrid distils a Llama-architecture Transformer ({', '.join(SUPPORTED_TEACHERS)}); "
                         f"{teacher.name} is a {arch}. Use zoo:transformer-kv or a Llama checkpoint")
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(cfg, flag, False):
            raise InputError(f"{teacher.name} has {flag}=True; Falcon-H1 students are built from bias-free Llamas")
    if cfg.hidden_act != "silu":
        raise InputError(f"{teacher.name}'s MLP uses {cfg.hidden_act!r}; Falcon-H1's MLP is SwiGLU (silu)")
    from gna_interp.zoo.tokenizer import zoo_keys

    if teacher.kv_words != zoo_keys():
        raise InputError(f"build_hybrid distils on the zoo's training data, so the teacher must use the zoo tokenizer "
                         f"and keys; {teacher.name} is not a zoo model (no zoo card keys). Use zoo:transformer-kv")
    return cfg


def student_recipe(teacher: "Model", lay: Layout, cfg: HybridConfig, seed: int, name: str,
                   base: Recipe | None = None) -> Recipe:
    """The zoo :class:`~gna_interp.zoo.training.Recipe` of the Falcon-H1 student: the teacher's widths, norms
    and RoPE, ``lay.slots`` attention slots of the teacher's head size, ``cfg``'s Mamba-2 mixer, every muP
    multiplier 1; training data (dictionary sizes, queries) and optimizer settings from ``base`` (default:
    the ``transformer-kv`` recipe; every zoo model trains on the same data) with ``cfg``'s steps, lr, warmup
    and batch size, and ``seed``."""
    t = _check_teacher(teacher)
    d_head = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    config = dict(
        hidden_size=t.hidden_size, intermediate_size=t.intermediate_size, num_hidden_layers=t.num_hidden_layers,
        num_attention_heads=lay.slots, num_key_value_heads=lay.slots, head_dim=d_head, hidden_act="silu",
        rms_norm_eps=t.rms_norm_eps, rope_parameters=dict(t.rope_parameters),
        max_position_embeddings=t.max_position_embeddings, tie_word_embeddings=bool(t.tie_word_embeddings),
        initializer_range=t.initializer_range, attention_bias=False, mlp_bias=False, projectors_bias=False,
        mamba_d_ssm=cfg.mamba_heads * cfg.mamba_head_dim, mamba_n_heads=cfg.mamba_heads,
        mamba_d_head=cfg.mamba_head_dim, mamba_n_groups=cfg.mamba_groups, mamba_d_state=cfg.mamba_state,
        mamba_d_conv=cfg.mamba_conv, mamba_chunk_size=cfg.mamba_chunk, mamba_rms_norm=False,
        mamba_conv_bias=True, mamba_proj_bias=False)
    kept = ", ".join(h.name for h in lay.keep) or "none"
    desc = (f"Retrieval-guided hybrid distilled from {teacher.name}: Falcon-H1, {t.num_hidden_layers} layers of "
            f"{cfg.mamba_heads} Mamba-2 heads (x {cfg.mamba_head_dim}, state {cfg.mamba_state}) in parallel with the "
            f"teacher's kept attention heads ({kept}; {lay.slots} attention slot(s) per layer), SwiGLU MLP "
            f"(width {t.intermediate_size}) from the teacher.")
    base = base or recipe("transformer-kv")
    return replace(base, name=name, family="hybrid", hf_class="FalconH1ForCausalLM", config_class="FalconH1Config",
                   config=config, description=desc, steps=cfg.steps, lr=float(cfg.lr), warmup=cfg.warmup,
                   batch_size=cfg.batch_size, seed=seed)


def _attn_slices(d_head: int, index: int) -> slice:
    return slice(index * d_head, (index + 1) * d_head)


@torch.no_grad()
def transplant(teacher_hf: torch.nn.Module, student_hf: torch.nn.Module, lay: Layout, ssm_init: str = "zero") -> None:
    """Copy into the Falcon-H1 ``student_hf`` what the Llama ``teacher_hf`` has in the same shape: token
    embeddings (and an untied unembedding), the final norm, every layer's two RMSNorms and SwiGLU MLP,
    and the kept heads' q/k/v rows and o_proj columns into their slots (key/value: the head the query
    head reads under grouped-query attention). Unused slots are zeroed; ``ssm_init="zero"`` zeroes the
    Mamba-2 output projections."""
    t, s = teacher_hf.model, student_hf.model
    tc = teacher_hf.config
    d_head = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    rep = tc.num_attention_heads // tc.num_key_value_heads
    s.embed_tokens.weight.copy_(t.embed_tokens.weight)
    if not student_hf.config.tie_word_embeddings:
        student_hf.lm_head.weight.copy_(teacher_hf.lm_head.weight)
    s.final_layernorm.weight.copy_(t.norm.weight)
    for layer, (tl, sl) in enumerate(zip(t.layers, s.layers)):
        sl.input_layernorm.weight.copy_(tl.input_layernorm.weight)
        sl.pre_ff_layernorm.weight.copy_(tl.post_attention_layernorm.weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(sl.feed_forward, name).weight.copy_(getattr(tl.mlp, name).weight)
        ta, sa = tl.self_attn, sl.self_attn
        for w in (sa.q_proj.weight, sa.k_proj.weight, sa.v_proj.weight, sa.o_proj.weight):
            w.zero_()
        for slot, h in enumerate(lay.kept[layer]):
            dst, src, kv = _attn_slices(d_head, slot), _attn_slices(d_head, h), _attn_slices(d_head, h // rep)
            sa.q_proj.weight[dst] = ta.q_proj.weight[src]
            sa.k_proj.weight[dst] = ta.k_proj.weight[kv]
            sa.v_proj.weight[dst] = ta.v_proj.weight[kv]
            sa.o_proj.weight[:, dst] = ta.o_proj.weight[:, src]
        if ssm_init == "zero":
            sl.mamba.out_proj.weight.zero_()


def unused_masks(student_hf: torch.nn.Module, lay: Layout) -> dict[str, Tensor]:
    """Parameter name -> boolean mask of the entries that belong to unused attention slots (q/k/v rows,
    o_proj columns); these are zero and must stay zero."""
    d_head = student_hf.config.head_dim
    masks: dict[str, Tensor] = {}
    for layer, sl in enumerate(student_hf.model.layers):
        free = range(len(lay.kept[layer]), lay.slots)
        if not free:
            continue
        sa = sl.self_attn
        for proj, cols in (("q_proj", False), ("k_proj", False), ("v_proj", False), ("o_proj", True)):
            m = torch.zeros_like(getattr(sa, proj).weight, dtype=torch.bool)
            for slot in free:
                if cols:
                    m[:, _attn_slices(d_head, slot)] = True
                else:
                    m[_attn_slices(d_head, slot)] = True
            masks[f"model.layers.{layer}.self_attn.{proj}.weight"] = m
    return masks


def _freeze_unused(student_hf: torch.nn.Module, masks: dict[str, Tensor]) -> None:
    params = dict(student_hf.named_parameters())
    for name, m in masks.items():
        keep = (~m).to(params[name].dtype)
        params[name].register_hook(lambda g, keep=keep: g * keep)


def _teacher_part(name: str) -> bool:
    return ".mamba." not in name


# ---- the loss ---------------------------------------------------------------------------------------


def distill_loss(teacher_hf: torch.nn.Module, kind: str = "kl") -> Callable[..., Tensor]:
    """A :data:`~gna_interp.zoo.training.LossFn` for :func:`~gna_interp.zoo.training.fit` (see the module
    docstring for ``kind``); the teacher runs without gradients."""
    check_choice("loss", kind, LOSSES)

    def loss(model: torch.nn.Module, inputs: Int[Tensor, "batch pos"], positions: Int[Tensor, "q"],
             values: Int[Tensor, "batch q"]) -> Float[Tensor, ""]:
        where = positions if kind in ("kl_answers", "ce") else None
        logits = model(input_ids=inputs, logits_to_keep=where if where is not None else 0).logits.float()
        total = logits.new_zeros(())
        if kind != "ce":
            with torch.no_grad():
                ref = teacher_hf(input_ids=inputs, logits_to_keep=where if where is not None else 0).logits.float()
            total = total + torch.nn.functional.kl_div(logits.log_softmax(-1).flatten(0, 1),
                                                       ref.log_softmax(-1).flatten(0, 1),
                                                       log_target=True, reduction="batchmean")
        if kind in ("ce", "kl+ce"):
            at = logits if where is not None else logits[:, positions]
            total = total + torch.nn.functional.cross_entropy(at.flatten(0, 1), values.flatten())
        return total

    return loss


# ---- the build --------------------------------------------------------------------------------------


def _teacher_model(teacher: "Model | str | os.PathLike") -> "Model":
    from gna_interp.models.loading import load_model
    from gna_interp.models.model import Model

    m = load_model(teacher, device="cpu") if isinstance(teacher, (str, os.PathLike)) else teacher
    if not isinstance(m, Model):
        raise InputError(f"teacher must be a Model or a model spec (e.g. 'zoo:transformer-kv'), got "
                         f"{type(teacher).__name__}")
    m.check_runnable()
    return m


def _sections(card: dict[str, Any]) -> dict[str, str]:
    h = card["hybrid"]
    teacher = h["teacher"]
    slots = "\n".join(f"| {s} | {t} |" for s, t in h["slots"].items()) or "| (none) | |"
    unused = ", ".join(h["unused_slots"]) or "none"
    trained = h["config"]["train_teacher_parts"]
    how = ("copied from the teacher's q/k/v/o slices, then trained with the rest" if trained else
           "the teacher's q/k/v/o slices, frozen: only the Mamba-2 mixers were trained")
    return {"Construction": f"""Distilled from `{teacher}` by `gna_interp.zoo.hybrid_build.build_hybrid`. Every layer
is a Falcon-H1 layer: the teacher's attention heads listed below ({how}), in parallel with {h['mamba']}
(new), then the teacher's SwiGLU MLP; embeddings and norms from the teacher{'' if trained else ' (frozen)'}.
Heads chosen: {h['chosen_by']}.

| student head | teacher head |
|---|---|
{slots}

Unused attention slots (q/k/v/o zero, kept at zero through training, so their output is identically zero
and a scan gives them no effect; not kept heads): {unused}."""}


@options
class HybridRun(TrainingRun):
    """A :class:`~gna_interp.zoo.training.TrainingRun` of :func:`build_hybrid`, plus what the student's card says
    of it: its ``name`` (None: ``out``'s folder name) and ``chosen_by``, how ``keep`` was chosen."""

    name: str | None = None
    chosen_by: str = "given"


def build_hybrid(teacher: "Model | str | os.PathLike", keep: Sequence[HeadRef | str], out: str | os.PathLike, *,
                 seed: int = 0, config: HybridConfig | None = None, run: TrainingRun | None = None,
                 **overrides: Any) -> TrainResult:
    """Distil ``teacher`` (a Llama zoo model) into a Falcon-H1 student that keeps the attention heads ``keep``
    (``[]``: none) and has Mamba-2 heads everywhere; save it to ``out`` as a zoo checkpoint and evaluate it.

    Keyword ``overrides`` adjust ``config`` (:class:`HybridConfig`: ``steps``, ``loss``, ...) and ``run``
    (:class:`HybridRun`, or a :class:`~gna_interp.zoo.training.TrainingRun`: ``eval_sizes``, ``eval_samples``,
    ``threads``, ``log``, ``log_every``, and the card's ``name`` and ``chosen_by``), each by its field names;
    ``seed`` seeds the student's initialisation and the training data stream. Returns the
    :class:`~gna_interp.zoo.training.TrainResult` (``out``, ``card``, losses).
    """
    run_names = HybridRun.field_names()
    base = run if run is None or isinstance(run, HybridRun) else HybridRun.build(None, **run.to_dict())
    opts = HybridRun.build(base, **{k: v for k, v in overrides.items() if k in run_names})
    overrides = {k: v for k, v in overrides.items() if k not in run_names}
    name, chosen_by = opts.name, opts.chosen_by
    log = opts.log
    threads = 1 if opts.threads is None else opts.threads
    log_every = 100 if opts.log_every is None else opts.log_every
    from gna_interp.models.loading import quiet_transformers
    from gna_interp.zoo.tokenizer import build_tokenizer

    cfg = HybridConfig.build(config, **overrides)
    check_int("seed", seed, 0)
    model = _teacher_model(teacher)
    lay = layout(model, keep)
    name = name or Path(out).name
    r = student_recipe(model, lay, cfg, seed, name)
    say = log or (lambda _msg: None)
    teacher_hf = model.hf_model.eval()
    tokenizer = build_tokenizer()  # the teacher's (checked: zoo keys), saved as every zoo model saves it
    with torch_threads(threads):
        with quiet_transformers():
            student = build_model(r, tokenizer)
        transplant(teacher_hf, student, lay, cfg.ssm_init)
        masks = unused_masks(student, lay)
        _freeze_unused(student, masks)
        frozen = [p for n, p in student.named_parameters() if not cfg.train_teacher_parts and _teacher_part(n)]
        for p in frozen:
            p.requires_grad_(False)
        params = [(n, p) for n, p in student.named_parameters() if p.requires_grad]
        counts = parameter_counts(student)
        kept = ", ".join(h.name for h in lay.keep) or "no heads"
        say(f"{name}: FalconH1ForCausalLM, {counts['total']:,} parameters, keeps {kept} ({lay.slots} slot(s) per "
            f"layer), {cfg.steps} steps, loss {cfg.loss}, seed {seed}")
        losses, wall = fit(student, r, tokenizer, distill_loss(teacher_hf, cfg.loss), params=params, log=log,
                           log_every=log_every)
        for p in frozen:
            p.requires_grad_(True)
        card = card_for(r, counts, wall, losses)
        card["training"]["loss"] = {
            "kl": "KL(teacher || student) of the next-token distribution at every position of the training sequences",
            "kl_answers": "KL(teacher || student) of the next-token distribution at every answer position",
            "ce": "cross-entropy of every answer's value token (no teacher)",
            "kl+ce": "KL(teacher || student) at every position + cross-entropy of the answers"}[cfg.loss]
        changed = "".join(f", {k}={v!r}" for k, v in cfg.to_dict().items() if v != getattr(HybridConfig(), k))
        card["training"]["reproduce"] = (f"gna_interp.zoo.build_hybrid({model.name!r}, "
                                         f"keep={[h.name for h in lay.keep]!r}, out=DIR, seed={seed}{changed})")
        card["hybrid"] = {
            "teacher": model.name, "kept": [h.name for h in lay.keep], "chosen_by": chosen_by,
            "slots": lay.slot_map(), "unused_slots": [h.name for h in lay.unused()],
            "attention_slots_per_layer": lay.slots,
            "mamba": f"{cfg.mamba_heads} Mamba-2 heads x {cfg.mamba_head_dim} channels (state {cfg.mamba_state}, "
                     f"{cfg.mamba_groups} group(s), conv {cfg.mamba_conv})",
            "config": cfg.to_dict(),
        }
        card = save_evaluated(student, tokenizer, out, card, opts, sections=_sections(card))
        say(f"  wrote {out}; accuracy " + ", ".join(f"{k} pairs {v['accuracy']:.3f}"
                                                     for k, v in card["evaluation"]["by_pairs"].items()))
        return TrainResult(Path(out), card, losses)
