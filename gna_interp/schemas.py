"""The schema of every gna_interp result document, checked by :mod:`gna_interp.store` on every read.

A result folder is untrusted input (a colleague's scan, a paper's supplement), so a reader never trusts a field:
each format below is a JSON Schema (draft 2020-12, checked with ``jsonschema``) stating the types, ranges and
lengths of its fields; tensor bundles (``views.pt``, pattern sets) use the extra type ``tensor``. Numbers are
finite by construction: the JSON reader refuses ``NaN``, ``Infinity`` and overflowing literals such as ``1e999``
(gna writes a non-finite value as ``null``). What a schema cannot say (per-sample lists of one length, a pattern
tensor shaped like its tokens) the loaders check after it; a folder's files are tied together by the ``run_id``
written into each of them (:meth:`gna_interp.circuits.Circuit.load`).

A document that breaks its schema is refused with one line naming the file, the field (as a path such as
``heads/3/drop``) and what is wrong.
"""

from __future__ import annotations

import functools
from typing import Any

from gna_interp.constants import CONTROL_JSON, DELEGATION_JSON, MAX_SAMPLES, N_BOOT_MAX, VIEWS_PT

__all__ = ["HEAD_NAME", "MAX_INT", "MAX_SAMPLES", "RUN_ID", "SCHEMAS", "schema_error"]

HEAD_NAME = r"^L[0-9]{1,9}[A-Z][0-9]{1,9}(\+[0-9]{1,9})?$"
RUN_ID = r"^[0-9a-f]{32}$"

# Bounds every number read from a result folder is held to (the reader refuses integers past MAX_INT outright)
MAX_INT = 2**63 - 1  # int64: any integer a result writes fits; a longer one (10**400) would overflow floats later
MAX_UNITS = 10_000_000  # heads / channels / curve steps of one model (Mamba-1 7B has 64 x 8,192 channels)
MAX_TOKENS = 100_000_000  # tokens of one prompt or one task

NUM: dict[str, Any] = {"type": "number"}
NUM_NULL: dict[str, Any] = {"type": ["number", "null"]}
NAT: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": MAX_INT}
INT: dict[str, Any] = {"type": "integer", "minimum": -MAX_INT, "maximum": MAX_INT}
SAMPLES: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": MAX_SAMPLES}
UNITS: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": MAX_UNITS}
PROB: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": 1}  # an accuracy, a chance level, a fraction
PROB_NULL: dict[str, Any] = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
STR: dict[str, Any] = {"type": "string"}
BOOL: dict[str, Any] = {"type": "boolean"}
HEAD: dict[str, Any] = {"type": "string", "pattern": HEAD_NAME}
RUN: dict[str, Any] = {"type": "string", "pattern": RUN_ID}
SECONDS: dict[str, Any] = {"type": ["number", "null"], "minimum": 0, "maximum": 1e12}


def arr(items: dict[str, Any], **limits: int) -> dict[str, Any]:
    """An array of ``items`` (``minItems`` / ``maxItems`` from ``limits``)."""
    return {"type": "array", "items": items, **limits}


def obj(required: dict[str, Any] | None = None, optional: dict[str, Any] | None = None,
        closed: bool = False) -> dict[str, Any]:
    """An object with ``required`` and ``optional`` fields (``closed``: no others)."""
    required, optional = required or {}, optional or {}
    out: dict[str, Any] = {"type": "object", "required": list(required), "properties": {**required, **optional}}
    if closed:
        out["additionalProperties"] = False
    return out


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or null (a typed schema gets ``null`` among its types, so an error names the field inside it)."""
    if isinstance(schema.get("type"), str):
        return {**schema, "type": [schema["type"], "null"]}
    return {"anyOf": [{"type": "null"}, schema]}


RECORDS = arr({"type": "object"})  # a table's rows; columns are checked by the reader that uses them
NUMBERS = {"type": "object", "additionalProperties": NUM_NULL}
# an Evaluation's metrics (a circuit's baseline): accuracies and chance in [0, 1], counts bounded
METRICS = {"type": "object", "properties": {"accuracy": PROB_NULL, "chance": PROB_NULL, "gold_prob": PROB_NULL,
                                            "n_samples": SAMPLES, "n_forwards": NAT, "seconds": SECONDS},
           "additionalProperties": NUM_NULL}
PER_SAMPLE = obj(optional={"logit_diff": arr(NUM_NULL, maxItems=MAX_SAMPLES), "correct": arr(BOOL, maxItems=MAX_SAMPLES),
                           "gold_score": arr(NUM_NULL, maxItems=MAX_SAMPLES), "n_gold": arr(NAT, maxItems=MAX_SAMPLES)},
                 closed=True)
HEAD_VALUES = {"type": "object", "propertyNames": {"pattern": HEAD_NAME}, "additionalProperties": NUM_NULL}
HEAD_SAMPLES = {"type": "object", "propertyNames": {"pattern": HEAD_NAME}, "additionalProperties": PER_SAMPLE}
TASK = obj({"name": {"type": "string", "maxLength": 400}},
           {"n_samples": SAMPLES, "args": obj(optional={"n_samples": SAMPLES, "n_pairs": SAMPLES, "seed": nullable(INT)}),
            "kind": {"enum": ["kv", "mc", "knowledge", "samples"]}})
LAYER_OR_HEAD = {"type": "integer", "minimum": 0, "maximum": 999_999_999}  # as HEAD_NAME's 9 digits
HEAD_ROW = obj(optional={"layer": LAYER_OR_HEAD, "head": LAYER_OR_HEAD, "name": HEAD, "rank": UNITS})  # a ranked row
# a role table's row: its named columns typed; the score columns (gather, aggregate, selectivity, ...) numbers
ROLE_ROW = {**obj(optional={"layer": LAYER_OR_HEAD, "head": LAYER_OR_HEAD, "name": HEAD, "rank": UNITS, "kind": STR,
                            "role": STR, "role_reason": STR, "offset": {"type": ["integer", "null"],
                                                                        "minimum": -MAX_TOKENS, "maximum": MAX_TOKENS},
                            **{k: NUM_NULL for k in ("gather", "gather_prev", "line_tokens", "aggregate", "to_summaries",
                                                     "to_items", "gold_share", "selectivity", "sharpness", "spread")}}),
            "additionalProperties": {"type": ["number", "null", "boolean", "string"]}}
CURVE_ROW = obj(optional={"k": UNITS, "accuracy": PROB_NULL, "seed": nullable(INT), "series": STR})
TWIN = obj({"task": STR, "k": UNITS, "intact": PROB_NULL, "top": PROB_NULL, "random_median": PROB_NULL},
           {"method": STR, "random": arr(PROB_NULL, maxItems=MAX_UNITS)})
ROLE_RULE = obj(optional={k: NUM for k in ("aggregate_min", "selectivity_min", "gather_min", "spread_min",
                                           "smooth_selectivity_min")}, closed=True)

SCAN = obj({"model": STR, "task": STR, "method": STR, "metric": STR, "strategy": STR, "heads": arr(HEAD)},
           {"baseline": nullable(PER_SAMPLE), "exact": HEAD_SAMPLES, "estimates": HEAD_VALUES, "sizes": HEAD_VALUES,
            "masses": HEAD_VALUES, "seconds": SECONDS, "unsettled": NAT, "screen_index": arr(NAT),
            "screened": HEAD_SAMPLES, "run_id": RUN})

# what each metric reads from a per-sample record (engine.metrics): a document's records must hold it
METRIC_KEYS = {"logit_diff": ["logit_diff"], "accuracy": ["correct"], "logprob": ["gold_score", "n_gold"]}


def metric_records(where: Any) -> list[dict[str, Any]]:
    """Conditions that the per-sample records of a document hold what its ``metric`` reads: ``where(need)`` is the
    schema placing ``need`` (``{"required": [...]}``) on each of them."""
    return [{"if": {"properties": {"metric": {"const": metric}}, "required": ["metric"]},
             "then": where({"required": keys})} for metric, keys in METRIC_KEYS.items()]


SCAN["allOf"] = metric_records(lambda need: {"properties": {
    "baseline": {"type": ["object", "null"], **need}, **{f: {"additionalProperties": need} for f in ("exact", "screened")}}})

CALIBRATION = obj({"rows": arr(obj({"form": {"type": "object"}, "task": STR, "accuracy": PROB, "chance": PROB,
                                    "n_samples": SAMPLES, "tokens": {"type": "number", "minimum": 0,
                                                                     "maximum": MAX_TOKENS}}, {"verdict": STR}),
                               minItems=1, maxItems=10_000),
                   "chosen": NAT},
                  {"named": {"type": "object"}, "saturated": PROB, "seconds": SECONDS,
                   "skipped": arr({"type": "object"})})

# circuit.json's "whole": an edge set of the whole graph (gna_interp.circuits.edges.whole_circuit checks its meaning)
WHOLE_NODE = obj({"name": {"type": "string", "pattern": f"^(?:{HEAD_NAME[1:-1]}|MLP[0-9]{{1,9}}|embed|logits)$"},
                  "kind": {"enum": ["head", "mlp", "embed", "logits"]},
                  "layer": {"type": "integer", "minimum": -1, "maximum": 999_999_999}}, {"role": nullable(STR)})
WHOLE_EDGE = obj({"sender": STR, "receiver": STR, "input": {"enum": ["q", "k", "v", "other", "mlp", "logits"]},
                  "positions": {"enum": ["items", "decision", "summary", "other", "all"]}},
                 {"score": NUM_NULL, "effect": NUM_NULL, "low": NUM_NULL, "high": NUM_NULL})
WHOLE = obj({"metric": STR, "method": STR, "nodes": arr(WHOLE_NODE, maxItems=MAX_UNITS),
             "edges": arr(WHOLE_EDGE, maxItems=MAX_UNITS)},
            {"threshold": NUM_NULL, "kept": NUM_NULL, "low": NUM_NULL, "high": NUM_NULL,
             "n_edges": nullable(UNITS)})

CIRCUIT = obj({"model": {"type": "string", "maxLength": 4096}, "task": TASK, "baseline": METRICS, "rule": ROLE_RULE,
               "scan_rows": UNITS, "run_id": RUN},
              {"heads": arr(HEAD_ROW), "roles": arr(ROLE_ROW), "n_samples": nullable(SAMPLES), "chance": PROB_NULL,
               "seed": nullable(INT), "curve": arr(CURVE_ROW), "seconds": SECONDS,
               "timings": {"type": "object", "additionalProperties": SECONDS},
               "profile": {"type": "object", "additionalProperties": obj(
                   {k: SECONDS for k in ("wall_s", "cpu_s")} | {k: NAT for k in ("block_calls", "block_rows",
                                                                                  "block_tokens")},
                   {"peak_rss_mb": SECONDS, "peak_cuda_mb": SECONDS}, closed=True)},
               "views": {"enum": [None, VIEWS_PT]}, "control": {"enum": [None, CONTROL_JSON]},
               "delegation": {"enum": [None, DELEGATION_JSON]},
               "generic_fraction": {"type": "number", "minimum": 0, "maximum": 1}, "keep_generic": BOOL,
               "model_in_memory": BOOL, "notes": arr(STR), "circuit": arr(HEAD), "generic": arr(HEAD), "twin": nullable(TWIN),
               "calibration": nullable(CALIBRATION),
               "edges": nullable(arr(obj({"edge": STR, "sender": HEAD, "receiver": {"type": "string", "pattern":
                                                                                   f"^(?:{HEAD_NAME[1:-1]}|logits)$"},
                                          "input": {"enum": ["q", "k", "v", "other", "logits"]},
                                          "positions": {"enum": ["summary", "items", "decision", "all"]},
                                          "effect": NUM, "low": NUM, "high": NUM}))),
               "pair_from": {"enum": [None, "edges", "patterns"]}, "path": nullable({"type": "object"}),
               "formats": arr(obj({"name": STR, "scan": STR}, {"task": nullable({"type": "object"})})),
               "whole": nullable(WHOLE)})

SEGMENTS = obj({"items": arr(arr(NAT, minItems=2, maxItems=2)), "final": NAT,
                "n_tokens": {"type": "integer", "minimum": 0, "maximum": MAX_TOKENS}, "aligned": BOOL},
               {"query": nullable(arr(NAT, minItems=2, maxItems=2))})
PATTERNS = obj({"heads": arr(HEAD), "str_tokens": arr(arr(STR)), "ids": {"type": "tensor"},
                "attention_mask": {"type": "tensor"}, "patterns": {"type": "tensor"}, "options": {"type": "object"}})
ALL_HEADS = obj({"heads": arr(HEAD), "sample": NAT, "n_tokens": NAT, "codes": {"type": "tensor"},
                 "scales": {"type": "tensor"}, "budget": NAT, "omitted": arr(HEAD)}, closed=True)
VIEWS = obj({"patterns": PATTERNS, "segments": arr(SEGMENTS), "gold": arr(NAT), "pred": arr(NAT),
             "candidates": arr(arr(STR, minItems=1)), "pair": nullable(arr(HEAD, minItems=2, maxItems=2)),
             "why": STR, "view": arr(HEAD)}, {"run_id": RUN, "all_heads": nullable(ALL_HEADS)})

DELEGATION = obj({"model": STR, "task": {"type": ["object", "string"]}, "chance": NUM, "roles": RECORDS,
                  "kinds": RECORDS, "removal": RECORDS},
                 {"knowledge": {}, "settings": {"type": "object"}, "notes": arr(STR), "seconds": SECONDS,
                  "run_id": RUN})

COMPARISON = obj({"names": arr(STR, minItems=2, maxItems=2), "k": NAT, "metrics": {"type": "object"},
                  "rows": RECORDS})

HYBRID_PLAN = obj({"model": STR, "architecture": STR, "layers": arr({"type": "object"}), "ranking": arr(HEAD),
                   "ks": arr(NAT), "lengths": arr(NAT), "dtype": STR, "dtype_source": STR, "d_state": NAT,
                   "d_conv": NAT, "order": STR, "table": RECORDS},
                  {"seed": nullable({"type": "integer"}), "source": STR, "notes": arr(STR)})

EXPERIMENT = obj(optional={"table": RECORDS})  # its checkpoints share the format; the rest is read by its class

# an interval's coverage and resamples, and the metric and ablation a measurement names
LEVEL: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}
N_BOOT: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": N_BOOT_MAX}
METRIC: dict[str, Any] = {"enum": list(METRIC_KEYS)}
ABLATION: dict[str, Any] = {"enum": ["zero", "mean", "resample"]}

# a faithfulness curve (gna circuit's faithfulness.json / edge_faithfulness.json): members are head or edge names,
# parsed by the loader (HeadRef.parse, Edge.parse); its fraction is of the logit difference, read off every point
MEMBERS = arr({"type": "string", "maxLength": 400}, maxItems=MAX_UNITS)
LOGIT_DIFF = {**PER_SAMPLE, "required": ["logit_diff", "correct"]}
FAITHFULNESS = obj({"metric": {"const": "logit_diff"}, "method": STR,
                    "n_heads": {**UNITS, "minimum": 1}, "threshold": {**NUM, "exclusiveMinimum": 0, "maximum": 1},
                    "n_boot": N_BOOT, "level": LEVEL, "intact": LOGIT_DIFF,
                    "empty": LOGIT_DIFF, "points": arr(obj({"series": {"enum": ["ranked", "random", "smallest"]},
                                                            "seed": INT, "size": UNITS, "results": LOGIT_DIFF},
                                                           {"heads": MEMBERS}), minItems=1, maxItems=MAX_UNITS),
                    "smallest": nullable(MEMBERS),
                    "minimality": {"type": "object", "additionalProperties": NUM}},
                   {"unit": {"enum": ["heads", "edges"]}, "order": nullable(MEMBERS), "summary": {"type": "object"},
                    "run_id": RUN})

# head interactions (Interactions.save): per-sample results of the intact model and of each head and pair removed;
# the loader checks that every list covers the same samples
INTERACTIONS = obj({"model": STR, "task": STR, "metric": METRIC, "method": ABLATION, "heads": arr(HEAD, maxItems=MAX_UNITS),
                    "baseline": PER_SAMPLE, "singles": arr(PER_SAMPLE, maxItems=MAX_UNITS),
                    "pairs": arr(obj({"i": NAT, "j": NAT, "results": PER_SAMPLE}, closed=True), maxItems=MAX_UNITS)},
                   {"level": LEVEL, "n_boot": N_BOOT, "seconds": SECONDS})
INTERACTIONS["allOf"] = metric_records(lambda need: {"properties": {
    "baseline": need, "singles": {"items": need}, "pairs": {"items": {"properties": {"results": need}}}}})

SCHEMAS: dict[str, dict[str, Any]] = {
    "scan": SCAN, "faithfulness": FAITHFULNESS, "circuit": CIRCUIT, "views": VIEWS, "patterns": PATTERNS, "delegation": DELEGATION,
    "comparison": COMPARISON, "hybrid_plan": HYBRID_PLAN, "interactions": INTERACTIONS,
    **{name: EXPERIMENT for name in ("eval", "prune", "mask", "sweep", "families", "hybrid_build")},
}


@functools.lru_cache(maxsize=None)
def _validator(fmt: str) -> Any:
    """The (cached) validator of ``fmt``'s schema, with the extra type ``tensor``."""
    import jsonschema

    base = jsonschema.Draft202012Validator

    def is_tensor(_checker: Any, value: Any) -> bool:
        import torch

        return isinstance(value, torch.Tensor)

    def is_array(_checker: Any, value: Any) -> bool:  # a bundle keeps lists as lists and tuples as tuples
        return isinstance(value, (list, tuple))

    checker = base.TYPE_CHECKER.redefine_many({"tensor": is_tensor, "array": is_array})
    return jsonschema.validators.extend(base, type_checker=checker)(SCHEMAS[fmt])


def schema_error(doc: Any, fmt: str) -> str | None:
    """What is wrong with ``doc`` as a ``fmt`` document (``"field 'heads/3': 'x' does not match ..."``), or None
    when it fits :data:`SCHEMAS` (formats without a schema always fit)."""
    if fmt not in SCHEMAS:
        return None
    import jsonschema

    def key(e: Any) -> tuple:  # jsonschema's relevance without its path (which breaks ties towards the last item)
        rel = jsonschema.exceptions.relevance(e)
        return (rel[0], *rel[2:])

    error = jsonschema.exceptions.best_match(_validator(fmt).iter_errors(doc), key=key)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    message = error.message if len(error.message) <= 160 else error.message[:157] + "..."
    return f"field {where!r}: {message}" if where else f"the document: {message}"
