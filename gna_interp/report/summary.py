"""`circuit_summary(circuit)`: the Markdown summary of a circuit (``summary.md``, and what ``gna scan --verbose``
prints): baseline, the circuit's heads with roles and control effects, the generic heads left out, the G&A pair, the
curve of retrieval and control, the formats, the twin, delegation, run time and the task form.
`circuit_brief(circuit)`: the few plain-text lines ``gna scan`` prints instead."""

from __future__ import annotations

import math
from typing import Any

from gna_interp.circuits.search.circuit import Circuit
from gna_interp.circuits.search.formats import one_format_heads

__all__ = ["circuit_brief", "circuit_summary", "edge_lines", "format_lines", "md_escape"]

# What Markdown (and the HTML it may carry) would read as markup: written as HTML entities or escaped, so a stored
# label such as ``<script>`` or ``**bold**`` reads as the text it is.
_MD = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "\\|", "`": "\\`", "*": "\\*", "[": "\\[",
                     "]": "\\]", "\\": "\\\\", "#": "\\#"})


def md_escape(text: str) -> str:
    """``text`` (a name or label read from a results file, not written by this module) as Markdown that shows it
    literally: markup characters escaped, line breaks and other control characters written as ``\\xNN``."""
    out = str(text).translate(_MD)
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}" for c in out)


def _decisive_text(circuit: Circuit) -> str:
    """The verdict on single removals, only as far as exact runs measured it."""
    scan = circuit.scan
    if circuit.at_chance():
        return "none: the intact model is itself at chance"
    ran = len(scan.exact)
    if not ran:
        return (f"not measured: no head was run exactly ({scan.strategy} scan; attribution estimates the "
                f"{'log-probability' if scan.estimand == 'logprob' else 'logit difference'}, not accuracy)")
    decisive = circuit.decisive()
    if decisive:
        return ", ".join(f"{h.name} ({a:.3f})" for h, a in decisive)
    if ran < len(scan.heads):
        return f"none among the {ran} heads run exactly (the other {len(scan.heads) - ran} were not measured)"
    return "none (the task survives every single removal)"


def circuit_summary(circuit: Circuit, top: int = 10) -> str:
    """A short Markdown summary: baseline, the circuit's heads with roles and control effects, the
    generic heads left out, the G&A pair, the curve of retrieval and control."""
    b = circuit.baseline
    loss = f", LM loss {b['lm_loss']:.3f} nats/token on neutral text" if "lm_loss" in b else ""
    lines = [f"# G&A circuit: {md_escape(str(circuit.model))} on {md_escape(str(circuit.task.get('name')))}", "",
             f"- baseline: accuracy {b.get('accuracy', math.nan):.3f} (chance {b.get('chance', math.nan):.3f}), "
             f"logit_diff {b.get('logit_diff', math.nan):.3f}{loss}; {circuit.task.get('n_samples')} samples",
             f"- scan: {len(circuit.scan.heads)} heads, {circuit.scan.strategy} strategy, {circuit.scan.method} ablation, "
             f"metric {circuit.scan.metric}, {len(circuit.scan.exact)} heads run exactly"
             + (f", {len(set(circuit.scan.screened) - set(circuit.scan.exact))} more ruled out by exact runs on "
                f"{len(circuit.scan.screen_index)} screening samples" if circuit.scan.screened else "")
             + (f" (stopped at max_exact: {circuit.scan.unsettled} unrun heads could still enter the leading ones)"
                if circuit.scan.unsettled else "")]
    lines += [f"- {md_escape(str(n))}" for n in circuit.notes]
    lines.append("- heads whose removal alone brings accuracy to chance: " + _decisive_text(circuit))
    df = circuit.to_frame()
    has_control = "control_drop" in df
    if has_control:
        gen = df[df["role"] == "generic"]
        lines.append(f"- generic heads (LM-loss rise >= {circuit.generic_fraction:.0%} of the intact loss), "
                     f"{'kept in' if circuit.keep_generic else 'left out of'} the circuit: " +
                     (", ".join(f"{r['name']} (rank {r['rank']}, +{r['control_drop']:.3f} nats/token"
                                f"{'' if r['control_source'] == 'exact' else ', estimated'})"
                                for _, r in gen.iterrows()) or "none"))
    df = _members(df)
    causal = "causal_role" in df
    lines += ["", "| rank | head | drop | source | role |" + (" causal role | direct path |" if causal else "")
              + " gather | aggregate | selectivity" + (" | LM-loss rise | specificity |" if has_control else " |"),
              "|---:|---|---:|---|---|" + ("---|---:|" if causal else "") + "---:|---:|---:|"
              + ("---:|---:|" if has_control else "")]
    for _, r in df.head(top).iterrows():
        cz = (f" {r['causal_role'] if isinstance(r['causal_role'], str) else ''} | "
              f"{_f(r.get('direct_effect'), 3)} |"
              if causal else "")
        lines.append(f"| {r['rank']} | {r['name']} | {_f(r['drop'], 3) or 'not run'} | {r['source']} | "
                     f"{md_escape(str(r['role']))} |{cz} "
                     f"{_f(r.get('gather'))} | {_f(r.get('aggregate'))} | {_f(r.get('selectivity'))} |"
                     + (f" {_f(r.get('control_drop'), 3)} | {_f(r.get('specificity'))} |" if has_control else ""))
    pair = circuit.pair()
    lines.append("")
    st = circuit.scan.stability()
    if st:
        lines.append(f"- rank stability ({st['n_exact']} heads run exactly, ranked on the even and on the odd "
                     f"samples): top-5 overlap {st['top5_overlap']}/{min(5, st['k'])}, top-{st['k']} overlap "
                     f"{st['top_k_overlap']}/{st['k']}; drops carry 95% bootstrap intervals "
                     f"(drop_lo, drop_hi in scan.csv)")
    if circuit.formats:
        lines += format_lines(circuit)
    if circuit.edges is not None:
        lines += edge_lines(circuit)
    if circuit.whole is not None:
        strongest = sorted(circuit.whole.edges, key=lambda e: -e.weight)[:5]
        lines.append(f"- whole circuit: {md_escape(circuit.whole.sentence())} Strongest edges: "
                     + ", ".join(f"{e.name} {e.weight:+.3f}" + ("" if e.measured else " (screened)") for e in strongest))
    if pair and circuit.path() is None:
        lines.append(f"- gather/aggregate pair (from pattern roles, not a measured path): {pair[0].name} -> "
                     f"{pair[1].name}")
    elif not pair:
        lines.append("- gather/aggregate pair: none (no measured key/value path holds, and no aggregate or no gather "
                     "head among the best-ranked heads by pattern)")
    lines += _curve_lines(circuit)
    if circuit.twin:
        t = circuit.twin
        rnd = (f", {_f(t['random_median'], 3)} with {t['k']} random heads removed (median of {len(t['random'])} "
               f"draws)" if t.get("random") else "")
        lines.append(f"- knowledge twin {t['task']}: accuracy {t['intact']:.3f} intact, {t['top']:.3f} with the top "
                     f"{t['k']} removed{rnd} (zero ablation)")
    if circuit.delegation is not None:
        lines += ["", "```", circuit.delegation.summary(), "```", ""]
    if circuit.timings:
        lines.append(f"- run time: {circuit.seconds:.0f} s (" + ", ".join(f"{k} {v:.0f} s" for k, v in circuit.timings.items())
                     + ")")
    if circuit.calibration is not None:
        lines += ["", "## Task form", ""] + circuit.calibration.lines()
    if circuit.profile:
        lines += ["", "## Cost by stage", ""] + profile_lines(circuit)
    return "\n".join(lines) + "\n"


def profile_lines(circuit: Circuit) -> list[str]:
    """Each stage's cost (:attr:`Circuit.profile`) as a Markdown table: wall and CPU seconds, the blocks the model
    ran with their rows and tokens, and the peak resident memory."""
    lines = ["| stage | wall s | CPU s | blocks run | rows | tokens | peak memory MB |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, c in circuit.profile.items():
        peak = "" if c.peak_rss_mb is None else f"{c.peak_rss_mb:,.0f}"
        lines.append(f"| {name} | {c.wall_s:.1f} | {c.cpu_s:.1f} | {c.block_calls:,} | {c.block_rows:,} | "
                     f"{c.block_tokens:,} | {peak} |")
    return lines

def edge_lines(circuit: Circuit) -> list[str]:
    """The measured paths: the strongest gather -> aggregate path, the strongest edges, and every edge-table head's
    causal role in words where it differs from its pattern role."""
    e = circuit.edges
    assert e is not None
    heads = sorted(set(e["sender"]))
    out = [f"- edge table (path patching among {', '.join(heads)}: keys/values at the lines' tokens, the query at "
           f"the decision position, the direct path to the logits; logit-difference drop with 95% interval; "
           f"circuit.json 'edges'):"]
    path = circuit.path()
    out.append(f"  - strongest gather -> aggregate path: {path['edge']} {path['effect']:+.3f} "
               f"[{path['low']:+.3f}, {path['high']:+.3f}]" if path else
               "  - strongest gather -> aggregate path: none -- no key/value edge has an interval above 0")
    strong = e[e["low"] > 0].sort_values("effect", ascending=False).head(5)
    out.append("  - strongest edges: " + (", ".join(f"{r['edge']} {r['effect']:+.3f} [{r['low']:+.3f}, "
                                                     f"{r['high']:+.3f}]" for _, r in strong.iterrows()) or "none"))
    df = circuit.to_frame()
    for _, r in df[df["causal_role"].notna()].iterrows():
        pattern = r.get("pattern_role", r["role"])
        agree = "agrees with" if r["causal_role"] == pattern else "differs from"
        out.append(f"  - {r['name']}: causal role {r['causal_role']} ({agree} its pattern role {md_escape(str(pattern))}): "
                   f"{r['causal_reason']}")
    return out


def format_lines(circuit: Circuit) -> list[str]:
    """The formats scanned, the circuit's consistent effects and the heads that matter in one format only."""
    names = [circuit.task.get("name", "task"), *circuit.formats]
    df = circuit.to_frame()
    members = _members(df)
    top = ", ".join(f"{r['name']} ({r['consistent']:.2f})" for _, r in members.head(5).iterrows())
    one = one_format_heads(df, names)
    return [f"- formats scanned: {', '.join(names)}; the circuit is ranked by the consistent effect (the smallest "
            f"relative logit-difference drop over the formats): {top}",
            "- heads that matter in one format only (top 10 there, consistent effect below a quarter of it): " +
            (", ".join(f"{h} ({f}: {d:.2f}, consistent {c:.2f})" for h, f, d, c in one) or "none")]

def _curve_lines(circuit: Circuit) -> list[str]:
    cs = circuit.curve_summary()
    if not cs:
        return []
    k = cs["k"]
    out = [f"- removing the top {k} circuit heads: accuracy {cs['top']:.3f}; {k} random heads (not in the "
           f"circuit's top {k}): median {cs['random_median']:.3f}, mean {cs['random_mean']:.3f} (min "
           f"{cs['random_min']:.3f}, max {cs['random_max']:.3f}, {cs['seeds']} seeds); baseline {cs['baseline']:.3f}"]
    if cs["seeds"] and cs["baseline"] is not None:
        top_drop, med_drop, verdict = _against_random(cs)
        ratio = (f", {top_drop / med_drop:.1f}x the random median's drop ({med_drop:.3f})" if med_drop > 1e-9
                 else f"; the random median's drop is {med_drop:.3f}")
        out.append(f"- so the top {k} cost {top_drop:.3f} accuracy, {verdict}{ratio} (the smallest random drop "
                   f"was {cs['baseline'] - cs['random_max']:.3f})")
    curve = circuit.curve if "lm_loss" in circuit.curve else circuit.curve.assign(lm_loss=math.nan)
    means = curve.groupby(["series", "k"])[["accuracy", "lm_loss"]].median()
    steps = [f"k={j} {means.loc[('top', j), 'accuracy']:.3f} vs {means.loc[('random', j), 'accuracy']:.3f}"
             for j in range(1, k + 1) if ("top", j) in means.index and ("random", j) in means.index]
    if steps:
        out.append("- accuracy curve, top k vs k random (median over the seeds measured at each k): " + ", ".join(steps))
    if means["lm_loss"].notna().any() and ("top", k) in means.index:
        base = circuit.baseline.get("lm_loss", math.nan)
        parts = [f"top {k} +{means.loc[('top', k), 'lm_loss'] - base:.3f}"]
        if ("random", k) in means.index:
            parts.append(f"{k} random +{means.loc[('random', k), 'lm_loss'] - base:.3f} (median)")
        gk = int(curve.loc[curve["series"] == "generic", "k"].max()) if "generic" in set(curve["series"]) else 0
        if gk:
            parts.append(f"top {gk} generic +{means.loc[('generic', gk), 'lm_loss'] - base:.3f} (accuracy "
                         f"{means.loc[('generic', gk), 'accuracy']:.3f})")
        out.append("- LM-loss rise on neutral text (nats/token): " + ", ".join(parts))
    return out


def _against_random(cs: dict[str, Any]) -> tuple[float, float, str]:
    """From a curve summary with random draws: the top k's drop, the random median's drop and the verdict."""
    top_drop, med_drop = cs["baseline"] - cs["top"], cs["baseline"] - cs["random_median"]
    verdict = ("more than any random draw" if top_drop > cs["baseline"] - cs["random_min"] else
               "no more than some random draw: the circuit is not distinguished at this k")
    return top_drop, med_drop, verdict


def _members(df: Any) -> Any:
    """The rows of :meth:`Circuit.to_frame` that are in the circuit, in circuit order (every row where the frame
    has no ``circuit_rank``)."""
    return df[df["circuit_rank"].notna()].sort_values("circuit_rank") if "circuit_rank" in df else df


def circuit_brief(circuit: Circuit, heads: int = 3) -> list[str]:
    """The circuit in a few lines of plain text (no Markdown), for a terminal: its ``heads`` best-ranked heads with
    their roles and drops and the strongest measured path; the top k removed together against k random heads; the
    controls."""
    return [line for line in (_heads_brief(circuit, heads), _curve_brief(circuit), _controls_brief(circuit)) if line]


def _heads_brief(circuit: Circuit, n: int) -> str:
    """The ``n`` best-ranked heads of the circuit, each with its role and the drop of removing it alone."""
    rows = _members(circuit.to_frame()).head(n)
    heads = ", ".join(f"{r['name']} {r['role']} {_f(r['drop']) or 'not run'}"
                      + ("" if r["source"] == "exact" else " (estimated)") for _, r in rows.iterrows())
    path = circuit.path()
    via = f"; path {path['edge']} {path['effect']:+.2f}" if path else ""
    return f"top heads ({circuit.scan.metric} drop, each removed alone): {heads}{via}"


def _curve_brief(circuit: Circuit) -> str:
    """The top k heads removed together against k random heads, in accuracy."""
    b, cs = circuit.baseline, circuit.curve_summary()
    if circuit.at_chance():
        return (f"the intact model is at chance (accuracy {b['accuracy']:.3f}, chance {b['chance']:.3f}): no head "
                f"can be told apart by removing it")
    if not cs or cs["baseline"] is None:
        return ""
    k = cs["k"]
    line = f"removing the top {k}: accuracy {cs['baseline']:.3f} -> {cs['top']:.3f}"
    if "chance" in b:
        line += f" (chance {b['chance']:.3f})"
    if not cs["seeds"]:
        return line + "; no random heads drawn"
    top_drop, med_drop, verdict = _against_random(cs)
    ratio = f"{top_drop / med_drop:.1f}x their drop, " if med_drop > 1e-9 else ""
    return line + f"; {k} random heads -> {cs['random_median']:.3f} (median of {cs['seeds']}): {ratio}{verdict}"


def _controls_brief(circuit: Circuit) -> str:
    """The LM-loss control (the generic heads) and the knowledge twin, or that they were not measured."""
    names = [h.name for h in circuit.generic]
    if circuit.control is None:
        lm = "LM loss on neutral text not measured"
    elif not names:
        lm = f"no generic head (none raises the LM loss on neutral text by {circuit.generic_fraction:.0%} or more)"
    else:
        lm = (f"{len(names)} generic head{'s' * (len(names) > 1)} (LM-loss rise >= {circuit.generic_fraction:.0%}) "
              f"{'kept in' if circuit.keep_generic else 'left out of'} the circuit: {', '.join(names[:4])}"
              + ", ..." * (len(names) > 4))
    t = circuit.twin
    twin = (f"knowledge twin: accuracy {t['intact']:.3f} intact, {t['top']:.3f} without the top {t['k']}"
            + (f", {t['random_median']:.3f} without {t['k']} random" if t.get("random") else "")
            if t else "knowledge twin not measured")
    return f"controls: {lm}; {twin}"


def _f(v: Any, digits: int = 2) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.{digits}f}"
