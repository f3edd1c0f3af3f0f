"""The graph's edges, measured: path patching (a sender's write along one receiver input, :mod:`.paths`) and its
store, causal roles read off the edge table (:mod:`.causal`), edge circuits (every edge outside a set ablated,
:mod:`.edge_circuit`), the whole-graph screen (:mod:`.edge_screen`) and the whole circuit read back
(:mod:`.whole_circuit`); the two runners read and write a block's receiver inputs through :mod:`.block_io`. The nodes, receiver inputs and position classes they name are
:mod:`gna_interp.models.graph`'s."""
