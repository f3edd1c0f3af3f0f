"""`GnaLM`: lm-evaluation-harness's model interface over a gna_interp :class:`Model`, with an
intervention (heads ablated, patterns masked) applied to every forward of the run.

``lm_eval`` calls three methods; each is answered from the bridge through :class:`Model`, never from
a second copy of the weights:

=======================  ======================================================================
request                  how it is computed
=======================  ======================================================================
``loglikelihood``        ``(context, continuation)`` encoded as lm-eval's ``TemplateLM`` does
                         (whole string, then split; an empty context becomes the BOS/EOS token);
                         requests sharing a context are laid out by gna_interp's scoring engine
                         (:func:`~gna_interp.engine.layout.layout_chunks`: one forward per batch,
                         the continuations of one context packed behind it under a tree mask on
                         attention-only models, full left-padded rows otherwise); the log-prob is
                         the sum over the continuation's tokens of the float32 log-softmax (``read_logprobs``),
                         ``is_greedy`` whether every token is the argmax
``loglikelihood_rolling``  lm-eval's rolling windows (``max_length`` tokens, one token of context),
                         each scored as above, summed per document
``generate_until``       greedy decoding, ``batch_size`` prompts a forward, left-padded; stops at
                         the EOS token, a stop sequence (``until``) or ``max_gen_toks`` new tokens;
                         the text is cut at the first stop sequence. Attention-only models continue
                         from the KV cache; SSMs, hybrids and masked runs recompute the whole rows
=======================  ======================================================================

Contexts longer than ``max_length`` (default: the model's context, else 2048) are cut from the left,
as lm-eval's Hugging Face model does.

The intervention holds for the whole run: ``heads=`` (or ``circuit=DIR`` with ``top_k``) are
ablated (:class:`~gna_interp.interventions.HeadAblation`: ``zero``, or ``mean`` over a reference
text) in every forward, and ``mask=`` restricts patterns (:class:`~gna_interp.interventions.PatternMask`), rebuilt
for every forward's tokens; scoring runs through :meth:`PlanRunner.reads_under
<gna_interp.engine.replay.PlanRunner.reads_under>`.

Importing this module registers the class with lm-eval as ``"gna"``::

    import gna_interp.experiments.harness  # noqa: F401  (registers "gna")
    lm_eval.simple_evaluate(model="gna", model_args="model=smollm2-135m,heads=L16H0 L18H6", tasks=[...])
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from jaxtyping import Float
from torch import Tensor
from gna_interp.progress import tqdm

from gna_interp.errors import InputError, install_hint
from gna_interp.interventions.ablation import AblationMethod, HeadAblation, ablation_hooks
from gna_interp.interventions.base import Intervention, applied
from gna_interp.interventions.masking import PatternMask
from gna_interp.models.heads import HeadRef
from gna_interp.models.mixer import MaskOptions
from gna_interp.models.model import Model, TokenBatch
from gna_interp.options import Options, options
from gna_interp.tasks.sample import Sample
from gna_interp.engine.replay import FORWARDS, PlanRunner
from gna_interp.engine.plan import Row, ScoringPlan, Target, for_model

def require_lm_eval() -> str:
    """The installed lm-eval version; :class:`InputError` saying how to install it when it is missing."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise InputError(f"lm-evaluation-harness (the lm-eval package) is not installed; it runs the benchmarks "
                         f"of gna eval: {install_hint('eval')}") from None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return str(getattr(lm_eval, "__version__", "unknown"))


LM_EVAL_VERSION = require_lm_eval()

from lm_eval import utils as lm_utils  # noqa: E402
from lm_eval.api.model import TemplateLM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402

__all__ = ["ABLATION_METHODS", "DEFAULT_MAX_LENGTH", "FullMask", "GnaLM", "HarnessConfig", "LM_EVAL_VERSION",
           "MaskFn", "neutral_reference", "parse_heads_arg", "require_lm_eval"]

log = logging.getLogger(__name__)

MaskFn = Callable[[TokenBatch], Mapping[HeadRef | str, Float[Tensor, "*batch q k"]]]
ABLATION_METHODS: tuple[str, ...] = ("zero", "mean")  # resample needs aligned reference rows: not a whole-run edit
DEFAULT_MAX_LENGTH = 2048  # as lm-eval's Hugging Face model, for models whose config gives no context length
# generation arguments that change greedy decoding's output (top_k, top_p, temperature only act when sampling)
_CHANGES_GREEDY = {"num_beams": 1, "repetition_penalty": 1.0, "no_repeat_ngram_size": 0}


@dataclass(frozen=True)
class FullMask:
    """A :data:`MaskFn` that masks the whole pattern of each of ``heads`` (every entry 0) in every forward:
    an attention head then outputs zero, an SSM head or channel keeps only its ``D x`` skip term."""

    heads: tuple[HeadRef | str, ...]

    def __call__(self, batch: TokenBatch) -> dict[HeadRef | str, Float[Tensor, "q k"]]:
        """A ``[T, T]`` zero mask per head for a forward of ``T`` positions."""
        t = batch.ids.shape[1]
        zero = torch.zeros((t, t), device=batch.ids.device)
        return {h: zero for h in self.heads}


def parse_heads_arg(heads: str | HeadRef | Sequence[str | HeadRef] | None) -> list[str | HeadRef]:
    """Head names from a list or one string separated by commas, spaces, ``;`` or ``|`` (lm-eval's
    ``model_args`` string splits on commas, so ``heads=L16H0 L18H6`` passes two heads there)."""
    if heads is None:
        return []
    if isinstance(heads, (str, HeadRef)):
        heads = [heads]
    out: list[str | HeadRef] = []
    for h in heads:
        if isinstance(h, str):
            out += [p for p in h.replace(";", " ").replace("|", " ").replace(",", " ").split() if p]
        else:
            out.append(h)
    return out


def neutral_reference() -> list[str]:
    """The paragraphs of the shipped neutral prose: the default reference of ``mean`` ablation (a head's
    mean output over ordinary text, not over the benchmark being measured)."""
    from gna_interp.tasks.text import NeutralText

    return [s.prompt + s.candidates[0] for s in NeutralText()]


@options
class HarnessConfig(Options):
    """The intervention and the limits of a :class:`GnaLM` run.

    Attributes:
        heads: heads ablated in every forward (names, ``"L16H0,L18H6"`` or HeadRefs).
        circuit: instead of ``heads``, a ``gna scan`` folder (or a loaded Circuit) whose ``top_k`` best-ranked
            heads are ablated.
        method: ``zero`` (the paper's ablation) or ``mean`` (the head's mean output over ``reference``,
            default the shipped neutral prose).
        mask: ``TokenBatch -> {head: mask}`` applied with :func:`mask_pattern` in every forward (see
            :class:`FullMask`), or head names whose whole pattern is masked; ``mask_options`` how.
        batch_size: sequences a forward (contexts a forward where continuations are packed).
        max_length: context limit in tokens (default: the model's, else 2048); ``max_gen_toks``: default
            limit of new tokens when a task gives none.
        device, dtype: used only when the model is a spec.
        progress: show progress bars.
        max_batch_size: accepted because lm-eval passes it (unused: batches are ``batch_size``).
    """

    heads: str | Sequence[str | HeadRef] | None = None
    circuit: Any = None
    top_k: int = 5
    method: AblationMethod = "zero"
    reference: Any = None
    mask: MaskFn | str | Sequence[str | HeadRef] | None = None
    mask_options: MaskOptions | None = None
    batch_size: int | str = 16
    max_length: int | None = None
    max_gen_toks: int = 256
    device: str | None = None
    dtype: str = "float32"
    progress: bool = True
    max_batch_size: int | None = None


@register_model("gna")
class GnaLM(TemplateLM):
    """lm-eval's ``LM`` over a gna_interp :class:`Model`, with an intervention for the whole run (``config``: the
    :class:`HarnessConfig` it was built with).

    Args:
        model: a loaded :class:`Model`, or a spec for :func:`~gna_interp.models.load_model` (alias,
            ``zoo:NAME``, a folder, a ``.gguf`` file, a hub id); ``pretrained`` is accepted as its alias.
        config: the intervention and limits (:class:`HarnessConfig`); keyword ``overrides`` may name its fields
            (``heads=``, ``circuit=``, ``top_k=``, ``method=``, ``mask=``, ``batch_size=``, ...), which is how
            lm-eval's ``--model_args key=value,...`` reach it.
        pretrained: the alias lm-eval uses for ``model``.
    """

    def __init__(self, model: Model | str | None = None, config: HarnessConfig | None = None,
                 pretrained: Model | str | None = None, **overrides: Any) -> None:
        """``config`` (:class:`HarnessConfig`) and keyword ``overrides`` of its fields: lm-eval passes
        ``--model_args key=value,...`` (and its ``batch_size``, ``max_batch_size``, ``device``) this way."""
        cfg = HarnessConfig.build(config, **overrides)
        heads, circuit, top_k, method, reference = cfg.heads, cfg.circuit, cfg.top_k, cfg.method, cfg.reference
        mask, mask_options, batch_size, max_length = cfg.mask, cfg.mask_options, cfg.batch_size, cfg.max_length
        max_gen_toks, device, dtype, progress = cfg.max_gen_toks, cfg.device, cfg.dtype, cfg.progress
        super().__init__()
        self.config = cfg  # the options as given (lm-eval's --model_args included)
        if model is not None and pretrained is not None:
            raise InputError("pass the model once: model= or pretrained=, not both")
        model = model if model is not None else pretrained
        if model is None:
            raise InputError("GnaLM needs a model: model=SPEC (e.g. smollm2-135m, zoo:transformer-kv) or a loaded Model")
        from gna_interp.experiments.run import model_of

        model = model_of(model, device, dtype)
        self.model = model
        self.tokenizer = model.tokenizer
        self._batch_size = _int_arg("batch_size", batch_size, 1, auto=16)
        self._max_gen_toks = _int_arg("max_gen_toks", max_gen_toks, 1)
        self._max_length = _int_arg("max_length", max_length, 2) if max_length is not None else \
            (model.n_ctx or DEFAULT_MAX_LENGTH)
        self.progress = bool(progress)
        if method not in ABLATION_METHODS:
            raise InputError(f"unknown ablation method {method!r} for a harness run; choose one of {ABLATION_METHODS}")
        self.method = method
        named = parse_heads_arg(heads)
        if circuit is not None:
            if named:
                raise InputError("pass heads= or circuit=, not both")
            named = _circuit_heads(model, circuit, top_k)
        self.heads: list[HeadRef] = list(dict.fromkeys(model.check_heads(named))) if named else []
        if method == "mean" and self.heads and reference is None:
            reference = neutral_reference()
        self.ablation = HeadAblation(tuple(self.heads), method, reference if method != "zero" else None)
        self._hooks = ablation_hooks(self.ablation.replacements(model)) if self.heads else []
        if mask is not None and not callable(mask):
            mask = FullMask(tuple(model.check_heads(parse_heads_arg(mask))))
        self.mask: MaskFn | None = mask  # type: ignore[assignment]
        self.mask_options = MaskOptions.build(mask_options)
        self._device = model.device

    # ---- what lm-eval asks about the model ---------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        return int(eos if eos is not None else self.tokenizer.pad_token_id)

    @property
    def prefix_token_id(self) -> int:
        """Token that stands for an empty context (and opens rolling windows): BOS, else EOS (as lm-eval's HF model)."""
        bos = self.tokenizer.bos_token_id
        return int(bos) if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", None) or self.model.name).replace("/", "__")

    def describe(self) -> str:
        """One line: the model and what the run changes in it."""
        parts = []
        if self.heads:
            parts.append(f"{self.method}-ablated {','.join(h.name for h in self.heads)}")
        if self.mask is not None:
            heads = getattr(self.mask, "heads", None)
            parts.append(f"patterns masked ({','.join(HeadRef.parse(h).name for h in heads)})" if heads
                         else "patterns masked")
        return f"{self.model.name}: {'; '.join(parts) or 'intact'}"

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval records in ``results["config"]``."""
        return {"model": self.model.name, "gna_intervention": self.describe(), "dtype": str(self.model.dtype),
                "ablated_heads": [h.name for h in self.heads], "ablation_method": self.method,
                "max_length": self.max_length}

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The tokenizer's chat template applied to ``chat_history`` (text, not ids)."""
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None,
                   **kwargs: Any) -> list[int]:
        """Token ids of ``string`` under the tokenizer's own special-token policy (as :class:`Model` and
        gna_interp's scoring tokenize), without special tokens when ``string`` already starts with BOS. Text outside
        the vocabulary is refused (:class:`InputError`, :meth:`Model.check_known`): a task whose words a word-level
        model does not know would otherwise be scored on unknown tokens."""
        kw: dict[str, Any] = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        bos = getattr(self.tokenizer, "bos_token", None)
        if add_special_tokens is None and bos and string.startswith(bos):
            kw = {"add_special_tokens": False}
        ids = list(self.tokenizer(string, **kw)["input_ids"])
        self.model.check_known(ids, string, hint=self._rebuild_hint(), what="an lm-eval request")
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def _rebuild_hint(self) -> str | None:
        """What to do about an lm-eval request in words the model does not know: for a model with its own keys (a zoo
        model), rebuild the tasks with them; otherwise :meth:`Model.check_known`'s own hint."""
        if not self.model.kv_words:
            return None
        spec = "MODEL" if self.model.in_memory else self.model.name
        return (f"this model knows only its own keys (model.kv_words, {len(self.model.kv_words)} words): rebuild the "
                f"tasks with them (python -m gna_interp.experiments.eval_tasks --model {spec} --out DIR, or "
                f"eval_tasks.write_task_folder(DIR, model.kv_words)) and pass --include-path DIR")

    def tok_decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids (special tokens dropped by default, as lm-eval's Hugging Face model decodes)."""
        return self.tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens)

    # ---- the intervention ------------------------------------------------------------------
    def interventions(self, batch: TokenBatch) -> list[Intervention]:
        """The run's interventions for a forward of ``batch``: the head ablation, and the pattern masks of its
        tokens."""
        masks = [PatternMask(self.mask(batch), self.mask_options)] if self.mask is not None else []
        return [self.ablation, *masks]

    def logits(self, batch: TokenBatch, **kwargs: Any) -> Float[Tensor, "batch pos vocab"]:
        """Logits of one forward of ``batch`` with the run's intervention (``kwargs`` go to the bridge,
        e.g. ``logits_to_keep``)."""
        with applied(self.model, self.interventions(batch)):
            return self.model.run_with_hooks(batch, (), **kwargs)

    # ---- loglikelihood ---------------------------------------------------------------------
    def _loglikelihood_tokens(self, requests: Sequence[tuple[Any, Sequence[int], Sequence[int]]],
                              disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        """``(log-prob, is_greedy)`` of each ``(key, context ids, continuation ids)``."""
        if not requests:
            return []
        prepared = [self._fit(ctx, cont) for _, ctx, cont in requests]
        plan, where = _token_plan(prepared)
        plan = for_model(self.model, plan)
        runner = PlanRunner(self.model, plan, batch_size=self.batch_size, replays=FORWARDS)
        values = (lambda chunk: self.interventions(chunk.batch)) if self.mask is not None else [self.ablation]
        total = torch.zeros(len(plan.targets), dtype=torch.float64)
        missed = torch.zeros(len(plan.targets), dtype=torch.long)
        with torch.no_grad(), tqdm(desc="gna loglikelihood", unit="batch", leave=False,
                                   disable=disable_tqdm or not self.progress) as bar:
            for read in runner.reads_under(values, bar.reset):
                bar.update()
                chunk = read.chunk
                total.index_add_(0, chunk.read_target, read.logprobs().double().cpu())
                miss = read.at_reads.float().argmax(-1).cpu() != chunk.read_tok
                missed.index_add_(0, chunk.read_target, miss.long())
        out = []
        for (key, _, _), pair in zip(requests, prepared):
            t = where[pair]
            answer = (float(total[t]), bool(missed[t] == 0))
            out.append(answer)
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return out

    def _fit(self, ctx: Sequence[int], cont: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(context, continuation)`` with the context cut from the left so that the fed tokens
        (context + continuation minus its last token) fit ``max_length``."""
        ctx, cont = tuple(ctx), tuple(cont)
        if not cont:
            raise InputError("a loglikelihood request has an empty continuation; lm-eval scores at least one token")
        if not ctx:
            raise InputError("a loglikelihood request has no context tokens (lm-eval gives the BOS/EOS token "
                             "for an empty context)")
        if len(cont) > self.max_length:
            raise InputError(f"a continuation of {len(cont)} tokens exceeds max_length {self.max_length}")
        over = len(ctx) + len(cont) - 1 - self.max_length
        if over > 0:
            log.warning("context of %d tokens cut from the left by %d to fit max_length %d", len(ctx), over,
                        self.max_length)
            ctx = ctx[over:]
        return ctx, cont

    def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[float]:
        """Summed log-prob of each whole string, over lm-eval's rolling windows of ``max_length`` tokens."""
        windows: list[tuple[None, list[int], list[int]]] = []
        owner: list[int] = []
        for i, (string,) in enumerate(r.args for r in requests):
            for ctx, cont in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (lp, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)):
            totals[i] += lp
        for r, t in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, t)
        return totals

    # ---- generation ------------------------------------------------------------------------
    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy continuation of each ``(context, gen_kwargs)``, cut at the first stop sequence."""
        args = [r.args for r in requests]
        out: list[str] = [""] * len(args)
        groups: dict[str, list[int]] = {}
        for i, (_, kw) in enumerate(args):
            groups.setdefault(json.dumps(kw, sort_keys=True, default=str), []).append(i)
        with tqdm(total=len(args), desc="gna generate_until", leave=False,
                  disable=disable_tqdm or not self.progress) as bar:
            for idx in groups.values():
                until, max_new = self._gen_settings(args[idx[0]][1])
                limit = self.max_length - max_new
                if limit < 1:
                    raise InputError(f"max_gen_toks {max_new} leaves no room for a context in max_length "
                                     f"{self.max_length}")
                enc = {i: self.tok_encode(args[i][0], left_truncate_len=limit) for i in idx}
                order = sorted(idx, key=lambda i: (-len(enc[i]), i))
                for k in range(0, len(order), self.batch_size):
                    part = order[k: k + self.batch_size]
                    for i, text in zip(part, self.generate([enc[i] for i in part], until, max_new)):
                        out[i] = text
                        self.cache_hook.add_partial("generate_until", args[i], text)
                    bar.update(len(part))
        return out

    def _gen_settings(self, gen_kwargs: Any) -> tuple[list[str], int]:
        if not isinstance(gen_kwargs, dict):
            raise InputError(f"generation arguments must be a dict, got {type(gen_kwargs).__name__}")
        kw = dict(gen_kwargs)
        if kw.get("do_sample") and float(kw.get("temperature", 1.0) or 0.0) > 0:
            raise InputError("this task samples (do_sample=True); gna's harness decodes greedily: set do_sample "
                             "false (gen_kwargs) or use lm-eval's own hf model for sampling")
        bad = [k for k, neutral in _CHANGES_GREEDY.items() if kw.get(k) is not None and kw[k] != neutral]
        if bad:
            raise InputError(f"generation arguments {bad} change the output of greedy decoding, which is what gna's "
                             f"harness runs; drop them from the task's generation_kwargs")
        until = kw.get("until")
        stops = [until] if isinstance(until, str) else list(until or [])
        eos = self.tokenizer.eos_token
        if eos and eos not in stops:
            stops.append(eos)
        max_new = kw.get("max_gen_toks", self.max_gen_toks)
        return [s for s in stops if s], _int_arg("max_gen_toks", max_new, 1)

    @torch.no_grad()
    def generate(self, contexts: Sequence[Sequence[int]], until: Sequence[str] = (),
                 max_new_tokens: int | None = None) -> list[str]:
        """Greedy continuations of a batch of token-id contexts (left-padded together) under the run's
        intervention: each stops at EOS, when its text holds a stop string of ``until``, or after
        ``max_new_tokens``; the text is cut at the first stop string."""
        max_new = self.max_gen_toks if max_new_tokens is None else max_new_tokens
        batch = self.model.pad_ids([list(c) for c in contexts])
        n = batch.ids.shape[0]
        eos = self.tokenizer.eos_token_id
        new: list[list[int]] = [[] for _ in range(n)]
        done = [False] * n
        ids, mask = batch.ids, batch.attention_mask
        cached = self.mask is None and self.model.splits_prefix_cache
        cache = nxt = None
        for _ in range(max_new):
            if cache is None:
                step = TokenBatch(ids, mask)
                if cached:
                    logits, cache = self.model.run_with_hooks(step, self._hooks, return_type="logits_and_cache",
                                                              logits_to_keep=1)
                else:
                    logits = self.logits(step, logits_to_keep=1)
            else:
                logits = self.model.continue_from(nxt, mask, cache, self._hooks)
            nxt = logits[:, -1].float().argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
            mask = torch.cat([mask, torch.ones_like(nxt)], 1)
            for r, tok in enumerate(nxt[:, 0].tolist()):
                if done[r]:
                    continue
                if eos is not None and tok == eos:
                    done[r] = True
                    continue
                new[r].append(tok)
                if until:
                    text = self.tok_decode(new[r], False)
                    done[r] = any(s in text for s in until)
            if all(done):
                break
        return [_cut(self.tok_decode(toks), until) for toks in new]


def _cut(text: str, until: Sequence[str]) -> str:
    """``text`` up to the first stop string (as lm-eval post-processes a generation)."""
    for s in until:
        if s:
            text = text.split(s)[0]
    return text


def _int_arg(name: str, value: Any, minimum: int, auto: int | None = None) -> int:
    if auto is not None and isinstance(value, str) and value.strip().startswith("auto"):
        log.warning("%s=auto is not supported by gna's harness; using %d", name, auto)
        return auto
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be an integer, got {value!r}") from None
    if isinstance(value, float) and value != v or v < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return v


def _circuit_heads(model: Model, circuit: Any, top_k: int) -> list[HeadRef]:
    """The ``top_k`` best-ranked heads of a circuit (a loaded Circuit, or a ``gna scan`` folder), resolved and checked
    against ``model`` as every experiment resolves one (:func:`~gna_interp.experiments.run.resolve_circuit`)."""
    from gna_interp.experiments.run import resolve_circuit

    k = _int_arg("top_k", top_k, 1)
    found, _ = resolve_circuit(model, circuit)
    return found.heads[:k]


def _token_plan(pairs: Sequence[tuple[tuple[int, ...], tuple[int, ...]]]
                ) -> tuple[ScoringPlan, dict[tuple[tuple[int, ...], tuple[int, ...]], int]]:
    """A :class:`ScoringPlan` in token space for ``(context, continuation)`` pairs, and the target of each pair.

    Pairs sharing a context form one plan sample (its candidates the distinct continuations), so the
    scoring engine runs the context once for all of them; rows are deduplicated as
    :func:`~gna_interp.engine.plan.plan_scoring` does (a continuation whose fed tokens are a prefix of
    another's is read from the longer row). The plan's samples only carry the candidate counts (their text
    is not needed: the tokens are given).
    """
    groups: dict[tuple[int, ...], dict[tuple[int, ...], None]] = {}
    for ctx, cont in pairs:
        groups.setdefault(ctx, {})[cont] = None
    samples, rows, targets, prompts = [], [], [], []
    where: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    for i, (ctx, conts_d) in enumerate(groups.items()):
        conts = list(conts_d)
        fed = [c[:-1] for c in conts]
        keep = sorted({f for f in fed if not any(len(g) > len(f) and g[: len(f)] == f for g in fed)})
        base = len(rows)
        rows.extend(Row(i, ctx + f, len(ctx)) for f in keep)
        for j, (f, c) in enumerate(zip(fed, conts)):
            r = next(k for k, g in enumerate(keep) if g[: len(f)] == f)
            where[(ctx, c)] = len(targets)
            targets.append(Target(i, j, base + r, c))
        samples.append(Sample("", tuple(f"#{j}" for j in range(len(conts))), 0))
        prompts.append(ctx)
    return ScoringPlan(tuple(samples), tuple(rows), tuple(targets), "auto", tuple(prompts)), where

