"""The plan engine: what runs a model on a task's samples and reads the scores, below the code that decides what to run.

A task (``gna_interp.tasks``) gives samples; the engine turns them into a plan and runs it:

- :mod:`gna_interp.engine.plan`: :func:`plan_scoring`, the rows to feed and the tokens to read so that every candidate
  is scored (:class:`ScoringPlan`), and :class:`CandidateScores`, what a run scored;
- :mod:`gna_interp.engine.layout`: the rows laid out as batches (:class:`Chunk`, :func:`layout_chunks`), packed under a
  tree-shaped mask where the model allows it, with the positions each metric reads;
- :mod:`gna_interp.engine.forward`: :func:`run_plan` (a whole plan, hooks applied to every forward), the chunk runner
  :func:`~gna_interp.engine.forward.read_chunks` and the :class:`ScoreTable` every runner fills;
- :mod:`gna_interp.engine.unembed`: the language-model head (final norm and unembedding) at the read positions,
  ``log p(token)`` from the unembedding run in vocabulary blocks (no ``reads x vocabulary`` logits), checked once per
  model against the full head; the read-out takes the head as a value (:class:`~gna_interp.engine.unembed.OutputHead`);
- :mod:`gna_interp.engine.metrics`: what a score means (logit difference, accuracy, log-probability);
- :mod:`gna_interp.engine.replay`: clean prefixes captured once per chunk (shared by every stage of a run), stacked
  replays of the blocks after the earliest removed head, nested sets replayed from the heads they add,
  :class:`~gna_interp.engine.replay.PlanRunner`, the one runner of interventions (a task's scores under any list of
  :mod:`gna_interp.interventions` values), and :class:`~gna_interp.engine.replay.SetAblation` (a task's scores with
  any set of heads removed, many sets stacked in one replay);
- :mod:`gna_interp.engine.attribution`: attribution patching, every head's first-order estimate from one forward
  and one backward per chunk.

What the engine learns about a model once (whether its head can be read in vocabulary blocks, whether a replay can
run on its recorded key-value cache, which pattern masks a replay reproduces) is kept on the model
(:attr:`Model.facts <gna_interp.models.model.Model.facts>`), not in module state.
"""

from gna_interp.engine.forward import RunOptions, ScoreTable, read_chunks, run_plan, score_candidates
from gna_interp.engine.layout import Chunk, layout_chunks
from gna_interp.engine.plan import CandidateScores, ScoringPlan, plan_of, plan_scoring
from gna_interp.engine.replay import FORWARDS, PlanRunner, Replays, SetAblation
from gna_interp.engine.unembed import read_logprobs

__all__ = ["CandidateScores", "Chunk", "FORWARDS", "PlanRunner", "Replays", "RunOptions", "ScoreTable", "ScoringPlan",
           "SetAblation", "layout_chunks", "plan_of", "plan_scoring", "read_chunks", "read_logprobs", "run_plan",
           "score_candidates"]
