"""auto-circuit's edge attribution on the peers' task, in a process of its own (run by ``benchmarks/peers.py`` with
the interpreter of the environment it builds for auto-circuit: auto-circuit wraps TransformerLens 2's
``HookedTransformer``, which TransformerLens 4 no longer has).

    python benchmarks/peers_autocircuit.py JOB.json OUT.json

Imports no gna_interp. ``JOB.json`` holds ``model_dir`` (a Hugging Face Llama folder: its ``*.safetensors``),
``hf_config`` (the Llama configuration's numbers, read by ``peers.py`` with the project's transformers),
``samples`` (each ``prompt`` ids, ``cands`` lists of ids -- one token each here --, ``gold``), ``tool`` (one of
:data:`TOOLS`), ``ig_steps``, ``edge_sets`` (``ac-exact``: ``{name: [edges]}``, each set left out at once, one set
at a time), ``threads``, ``device``, ``batch`` (prompts a forward) and ``grad_batch`` (prompts a forward of EAP and
EAP-IG). ``OUT.json`` gets ``clean`` (the intact metric), ``scores`` (``{"L0H1 -> L1H2.q": score}``,
auto-circuit's edges in the project's names), ``others`` (each prompt's best other candidate), ``n_edges``,
``wall_s``, ``cpu_s``, ``peak_mib`` and the versions.

The model: the folder's weights in ``transformers.LlamaForCausalLM`` (an explicit ``LlamaConfig``: the project's
config.json is written by a newer transformers), converted by TransformerLens's own ``convert_llama_weights`` into
a ``HookedTransformer`` with ``use_attn_result``, ``use_split_qkv_input``, ``use_hook_mlp_in`` (what auto-circuit's
factorized graph asserts) and, for grouped-query attention, ``ungroup_grouped_query_attention`` (auto-circuit makes
one K and one V input per query head; TransformerLens's grouped ``hook_k_input`` has one per KV head, which its
masks do not fit), no weight processing (no folded norms, no centring): the same function as the folder's model.

The metric is the project's logit difference: per prompt the gold candidate's logit minus the intact model's best
other candidate's (``answers`` / ``wrong_answers`` of auto-circuit's ``PromptDataset``), averaged over prompts
(``answer_function="avg_diff"``; ``grad_function="logit"``: with one answer and one wrong answer the difference of
logits is the difference of log-probabilities). Prompts of one length form a batch (auto-circuit's forward takes no
attention mask, so a batch holds no padding); each batch's mean is weighted by its share of the prompts. The EAP
tools' timed part includes the intact pass that picks each prompt's wrong answer (:func:`clean_pass`, one forward of
each batch), as the project's screen reads its metric's weights off its own intact forward.

Tools: ``ac-eap``: ``mask_gradient_prune_scores(mask_val=0.0)`` (edge attribution patching; the mask gradient at
the intact model is ``(clean - ablated) . d(-metric)/d(receiver input)``, the estimated drop); ``ac-eapig``: the
same with ``integrated_grad_samples=ig_steps`` (auto-circuit sums the mask gradients at ``ig_steps + 1`` mask
values ``0, 1/n, ..., 1``, both ends included; the scores written are that sum over ``ig_steps + 1``, a mean like
the project's); ``ac-exact``: each set of ``edge_sets`` left out under ``patch_mode(model, zero ablations,
edges=set)`` (every other edge kept), its drop of the metric (the best other candidate re-chosen, as the project's
exact effects do); a set is one edge, or a sender's edges into every head of a grouped-query KV group's K or V (the
project's edge circuit has one input there). Ablation: ``AblationType.ZERO`` throughout.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_worker import TIMER, _version, serve  # noqa: E402

TOOLS = ("ac-eap", "ac-eapig", "ac-exact")


def hooked_transformer(job: dict) -> Any:
    """The folder's Llama as a ``HookedTransformer`` (float32, no weight processing), edges hookable per head."""
    from safetensors.torch import load_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.llama import convert_llama_weights
    from transformers import LlamaConfig, LlamaForCausalLM

    c = job["hf_config"]
    hf = LlamaForCausalLM(LlamaConfig(**c)).eval()
    state: dict = {}
    for f in sorted(Path(job["model_dir"]).glob("*.safetensors")):
        state.update(load_file(str(f)))
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and c["tie_word_embeddings"])]
    if missing or unexpected:
        raise ValueError(f"{job['model_dir']}: weights missing {missing[:3]}, unexpected {unexpected[:3]}")
    grouped = c["num_key_value_heads"] != c["num_attention_heads"]
    cfg = HookedTransformerConfig(
        d_model=c["hidden_size"], d_head=c["head_dim"], n_heads=c["num_attention_heads"], d_mlp=c["intermediate_size"],
        n_layers=c["num_hidden_layers"], n_ctx=c["max_position_embeddings"], d_vocab=c["vocab_size"],
        act_fn="silu", normalization_type="RMS", eps=c["rms_norm_eps"], positional_embedding_type="rotary",
        rotary_dim=c["head_dim"], rotary_base=c["rope_theta"], rotary_adjacent_pairs=False, final_rms=True,
        gated_mlp=True, original_architecture="LlamaForCausalLM",
        n_key_value_heads=c["num_key_value_heads"] if grouped else None, ungroup_grouped_query_attention=grouped,
        use_attn_result=True, use_split_qkv_input=True, use_hook_mlp_in=True, default_prepend_bos=False,
        dtype=torch.float32, device=job["device"])
    model = HookedTransformer(cfg)
    with torch.no_grad():
        model.load_and_process_state_dict(convert_llama_weights(hf, cfg), fold_ln=False, center_writing_weights=False,
                                          center_unembed=False, fold_value_biases=False,
                                          refactor_factored_attn_matrices=False)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def node_name(name: str) -> str:
    """auto-circuit's node name in the project's: ``Resid Start`` -> ``embed``, ``A1.2`` -> ``L1H2``, ``A1.2.Q``
    -> ``L1H2.q``, ``MLP 0`` -> ``MLP0``, ``Resid End`` -> ``logits``."""
    if name == "Resid Start":
        return "embed"
    if name == "Resid End":
        return "logits"
    if name.startswith("MLP "):
        return f"MLP{name[4:]}"
    parts = name[1:].split(".")
    head = f"L{parts[0]}H{parts[1]}"
    return head if len(parts) == 2 else f"{head}.{parts[2].lower()}"


def edge_key(edge: Any) -> str:
    return f"{node_name(edge.src.name)} -> {node_name(edge.dest.name)}"


def batches(job: dict, others: list[int], size: int) -> list[tuple[float, list[int], Any]]:
    """(share of the prompts, the prompts, a one-batch ``PromptDataLoader`` of them) per group of at most ``size``
    prompts of one length."""
    from auto_circuit.data import PromptDataLoader, PromptDataset

    samples = job["samples"]
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        by_len.setdefault(len(s["prompt"]), []).append(i)
    out = []
    for _, idx in sorted(by_len.items()):
        for k in range(0, len(idx), size):
            part = idx[k:k + size]
            prompts = [torch.tensor(samples[i]["prompt"]) for i in part]
            answers = [torch.tensor([samples[i]["cands"][samples[i]["gold"]][0]]) for i in part]
            wrong = [torch.tensor([samples[i]["cands"][others[i]][0]]) for i in part]
            data = PromptDataset(prompts, prompts, answers, wrong)  # zero ablation: the corrupt prompt is unused
            out.append((len(part) / len(samples), part, PromptDataLoader(data, seq_len=None, diverge_idx=0,
                                                                   batch_size=len(part), shuffle=False)))
    return out


def metric_of(logits: torch.Tensor, samples: list[dict], idx: list[int]) -> tuple[float, list[int]]:
    """Mean over the prompts ``idx`` of the gold candidate's logit minus the best other's (last position's
    ``logits`` ``[prompts, vocab]``), and each prompt's best other candidate."""
    total, others = 0.0, []
    for row, i in enumerate(idx):
        s = samples[i]
        vals = [float(logits[row, c[0]]) for c in s["cands"]]
        other = max((j for j in range(len(vals)) if j != s["gold"]), key=lambda j: vals[j])
        total += vals[s["gold"]] - vals[other]
        others.append(other)
    return total / len(idx), others


@torch.no_grad()
def clean_pass(pm: Any, job: dict) -> tuple[float, list[int]]:
    """The intact metric and each prompt's best other candidate, from one forward of each batch of ``job["batch"]``
    prompts of one length (the patchable model with no patch mode: the plain model)."""
    samples = job["samples"]
    clean, others = 0.0, [0] * len(samples)
    for share, idx, _ in batches(job, [0] * len(samples), job["batch"]):
        tokens = torch.tensor([samples[i]["prompt"] for i in idx], device=torch.device(job["device"]))
        m, o = metric_of(pm(tokens)[pm.out_slice], samples, idx)
        clean += share * m
        for i, other in zip(idx, o):
            others[i] = other
    return clean, others


def run(job: dict) -> dict:
    from auto_circuit.types import AblationType
    from auto_circuit.utils.graph_utils import patch_mode, patchable_model

    samples, tool = job["samples"], job["tool"]
    if any(len(c) != 1 for s in samples for c in s["cands"]):
        raise ValueError("auto-circuit reads one position's logits (slice_output='last_seq'): every candidate must "
                         "be one token")
    model = hooked_transformer(job)
    pm = patchable_model(model, factorized=True, slice_output="last_seq", separate_qkv=True,
                         device=torch.device(job["device"]))
    clean, others = clean_pass(pm, job)  # untimed: the wrong answers of the warm-up's batch
    loaders = batches(job, others, job["batch"] if tool == "ac-exact" else job.get("grad_batch", job["batch"]))
    edges = sorted(pm.edges, key=lambda e: (e.dest.module_name, e.patch_idx))
    if tool == "ac-exact":
        from auto_circuit.utils.ablation_activations import src_ablations

        by_key = {edge_key(e): e for e in pm.edges}
        todo = {k: [by_key[m] for m in members] for k, members in job["edge_sets"].items()}
        with torch.no_grad():  # a warm-up: one edge left out on the first batch
            _, idx, loader = loaders[0]
            batch = next(iter(loader))
            with patch_mode(pm, src_ablations(pm, batch.clean, AblationType.ZERO), edges=next(iter(todo.values()))):
                pm(batch.clean)
        TIMER.start()
        scores = {k: 0.0 for k in todo}
        with torch.no_grad():
            for share, idx, loader in loaders:
                for batch in loader:  # one batch: the prompts idx, in order
                    zeros = src_ablations(pm, batch.clean, AblationType.ZERO)
                    base, _ = metric_of(pm(batch.clean)[pm.out_slice], samples, idx)
                    for k, es in todo.items():
                        with patch_mode(pm, zeros, edges=es):
                            got, _ = metric_of(pm(batch.clean)[pm.out_slice], samples, idx)
                        scores[k] += share * (base - got)
    else:
        from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores

        kw = ({"mask_val": 0.0} if tool == "ac-eap" else {"integrated_grad_samples": job["ig_steps"]})

        def prune(loader: Any) -> dict:
            return mask_gradient_prune_scores(pm, loader, None, grad_function="logit", answer_function="avg_diff",
                                              ablation_type=AblationType.ZERO, clean_corrupt=None, **kw)

        prune(loaders[0][2])  # warm-up (the first call of a forward and backward)
        TIMER.start()
        # the intact pass that picks each prompt's wrong answer (the best other candidate) is part of the method
        clean, others = clean_pass(pm, job)
        loaders = batches(job, others, job.get("grad_batch", job["batch"]))
        total: dict[str, torch.Tensor] = {}
        for share, _, loader in loaders:
            for mod, s in prune(loader).items():
                total[mod] = total[mod] + share * s if mod in total else share * s
        per = 1 / (job["ig_steps"] + 1) if tool == "ac-eapig" else 1.0  # IG: the sum over its points, as a mean
        scores = {edge_key(e): per * float(total[e.dest.module_name][e.patch_idx]) for e in edges}
    return {"clean": clean, "others": others, "scores": scores, "n_edges": len(pm.edges)}


def run_job(job: dict) -> dict:
    """One auto-circuit edge tool's run, with the versions it ran under."""
    return {**run(job), "version": f"auto-circuit {_version('auto-circuit')} (transformer-lens "
            f"{_version('transformer-lens')})"}


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(serve(sys.argv[1:], run_job))
