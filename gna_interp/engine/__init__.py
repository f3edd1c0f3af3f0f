"""The plan engine: a task's scoring plan run with heads removed, below the circuit code that decides what to remove.

- :mod:`gna_interp.engine.replay`: clean prefixes captured once per chunk (shared by every stage of a run),
  stacked replays of the blocks after the earliest removed head, nested sets replayed from the heads they add,
  and :class:`~gna_interp.engine.replay.SetAblation` (a task's scores with any set of heads removed);
- :mod:`gna_interp.engine.unembed`: the language-model head (final norm and unembedding) at the read positions, ``log p(token)`` from the unembedding run
  in vocabulary blocks (no ``reads x vocabulary`` logits), checked once per model against the full head;
- :mod:`gna_interp.engine.attribution`: attribution patching, every head's first-order estimate from one forward
  and one backward per chunk.

The forward of one chunk (logits at its reads only) is :func:`gna_interp.tasks.scoring.read_chunks`.
"""
