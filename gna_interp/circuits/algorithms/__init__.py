"""Discovery algorithms behind one signature: each scores a model's graph on a task, ``(model, task, **options) ->``
:class:`GraphScores` (one score per node or per edge), and is registered by name in one file of this package.

======================  =====  ===================================================================================
name                    unit   what a score is
======================  =====  ===================================================================================
``exact``               nodes  each head's ablation drop, measured (:func:`~gna_interp.circuits.scan.scan_heads`)
``attribution``         nodes  each head's drop, estimated to first order from one gradient pass
``auto``                nodes  estimated, then measured until the leading heads are settled
``eap``                 edges  each edge's drop by edge attribution patching
                               (:func:`~gna_interp.circuits.edges.edge_screen.screen_edges`)
``eap_ig``              edges  the same with integrated gradients along the ablation path
``edge_exact``          edges  each edge's drop, measured: the model with that edge alone left out
                               (:meth:`~gna_interp.circuits.edges.edge_circuit.EdgeCircuit.run_without`)
======================  =====  ===================================================================================

:func:`score_graph` runs one by name, :func:`algorithms` lists them; the circuit search reads any of them
(:func:`~gna_interp.circuits.search.sufficiency.faithfulness` node scores,
:func:`~gna_interp.circuits.search.sufficiency.edge_faithfulness` edge scores). Adding one is a file with an
``@algorithm("name")`` function (docs/architecture.md shows one).
"""

from gna_interp.circuits.algorithms.registry import (Algorithm, algorithm, algorithms, get_algorithm, score_graph,
                                                     unregister_algorithm)
from gna_interp.circuits.algorithms.scores import GraphScores

__all__ = ["Algorithm", "GraphScores", "algorithm", "algorithms", "get_algorithm", "score_graph",
           "unregister_algorithm"]
