"""Circuit search: :func:`.discovery.discover` (scan, roles, controls, the ablation curve, paths) and its
:class:`.circuit.Circuit`, the card views and format scans it keeps, faithfulness of node and edge circuits with the
smallest circuit (:mod:`.sufficiency`), comparisons of circuits and layer pruning."""
