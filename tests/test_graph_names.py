"""The graph's node names are parsed and printed in one place (gna_interp.models.graph): every kind round-trips,
the order of nodes is the forward pass's, receiver inputs name their readers, malformed names are refused."""

from __future__ import annotations

import math
import subprocess

import pytest

from gna_interp.errors import GnaError
from gna_interp.models.graph import Node, mlp_name, node_kind, read_order, receiver_nodes, write_order


@pytest.mark.parametrize("name, kind, layer", [("embed", "embed", -1), ("L3H1", "head", 3), ("L17S3", "head", 17),
                                               ("L35C3186", "head", 35), ("L2C0+16", "head", 2), ("MLP5", "mlp", 5),
                                               ("logits", "logits", None)])
def test_every_node_name_round_trips(name, kind, layer):
    node = Node.parse(name)
    assert (node.kind, node.layer, node.name) == (kind, layer, name) and node_kind(name) == kind


def test_nodes_are_ordered_as_the_forward_pass_runs():
    names = ["logits", "MLP1", "L1H0", "MLP0", "L0H3", "embed", "L2S1"]
    assert sorted(names, key=write_order) == ["embed", "L0H3", "MLP0", "L1H0", "MLP1", "L2S1", "logits"]
    assert write_order("logits") == math.inf and mlp_name(4) == "MLP4"


def test_receiver_inputs_name_their_readers_and_when_they_read():
    assert receiver_nodes("L5H0+L5H1.k") == (["L5H0", "L5H1"], "k")
    assert receiver_nodes("MLP2") == (["MLP2"], "mlp") and receiver_nodes("logits") == (["logits"], "logits")
    assert read_order("L5H0+L5H1.k", 8) == 5 and read_order("MLP2", 8) == 2.5 and read_order("logits", 8) == 8
    with pytest.raises(GnaError, match="HEAD.INPUT"):
        receiver_nodes("L5H0")


@pytest.mark.parametrize("bad", ["MLP", "MLPx", "MLP-1", "mlp3", "L3", "", "Embed", 3, None, "MLP" + "9" * 12])
def test_malformed_names_are_refused(bad):
    with pytest.raises(GnaError):
        Node.parse(bad)


def test_node_names_are_parsed_only_in_the_graphs_home():
    """No module of the package reads a node's kind off its name by hand."""
    out = subprocess.run(["grep", "-rn", "--include=*.py", 'startswith("MLP")', "gna_interp"], capture_output=True,
                         text=True, cwd=__import__("pathlib").Path(__file__).resolve().parents[1])
    assert out.stdout.strip().splitlines() == [], out.stdout
