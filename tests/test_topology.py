import math

import numpy as np
import pytest

from hetrain.cli import main
from hetrain.errors import UsageError
from hetrain.topology import TOPOLOGIES, make_topology


@pytest.mark.parametrize("name", TOPOLOGIES)
@pytest.mark.parametrize("n", [4, 8, 16])
def test_named_topologies_are_valid_and_mix(name, n):
    t = make_topology(name, n)
    w = t.mixing_matrix
    assert t.is_strongly_connected()
    assert np.allclose(w.sum(axis=1), 1.0)
    assert (w >= 0).all()
    if t.is_symmetric:
        assert np.allclose(w.sum(axis=0), 1.0)  # doubly stochastic: the average is preserved
    assert 0 < t.spectral_gap <= 1


def test_ring_spectral_gap_closed_form():
    n = 8  # weights 1/3: eigenvalues 1/3 + 2/3 cos(2 pi k / n)
    assert make_topology("ring", n).spectral_gap == pytest.approx(1 - (1 / 3 + 2 / 3 * math.cos(2 * math.pi / n)))


def test_degrees_and_neighbours():
    assert make_topology("ring", 5).in_neighbors[0] == [1, 4]
    assert make_topology("double_ring", 8).in_neighbors[0] == [1, 2, 6, 7]
    assert make_topology("hypercube", 8).in_neighbors[5] == [1, 4, 7]
    assert make_topology("exponential", 8).in_neighbors[0] == [4, 6, 7]
    assert len(make_topology("complete", 6).edges) == 30
    assert make_topology("torus", 9).in_neighbors[4] == [1, 3, 5, 7]


def test_distances_bound_the_gap():
    t = make_topology("ring", 8)
    assert t.distances_from(0) == [0, 1, 2, 3, 4, 3, 2, 1]


def test_edge_list_file(tmp_path):
    path = tmp_path / "edges.txt"
    path.write_text("# a directed 3-cycle\n0 1\n1 2\n2 0\n")
    t = make_topology(str(path), 3)
    assert not t.is_symmetric and t.out_neighbors[0] == [1]


@pytest.mark.parametrize("text, n, message", [
    ("0 1\n1 0\n2 3\n3 2\n", 4, "not strongly connected"),
    ("0 1\n1 5\n", 4, "outside 0..3"),
    ("0 one\n", 2, "expected 'SRC DST'"),
])
def test_bad_edge_lists(tmp_path, text, n, message):
    path = tmp_path / "edges.txt"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        make_topology(str(path), n)


@pytest.mark.parametrize("name, n, message", [
    ("hypercube", 6, "power-of-two"),
    ("torus", 7, "rows x cols"),
    ("moebius", 4, "unknown topology"),
    ("ring", 0, "positive"),
])
def test_bad_named_topologies(name, n, message):
    with pytest.raises(UsageError, match=message):
        make_topology(name, n)


def test_topology_command(capsys):
    assert main(["topology", "ring", "4"]) == 0
    out = capsys.readouterr().out
    assert "spectral gap 0.6667" in out and "worker   0  self 0.333" in out
    assert main(["topology", "hypercube", "6"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "power-of-two" in err[0]


# In-degree of every worker of the built-in graphs, worked out by hand: each is regular, so its
# Metropolis-Hastings (symmetric) or uniform (directed) weights are all 1 / (degree + 1), self included.
HAND_DEGREES = {
    "ring": {4: 2, 8: 2, 16: 2},  # i-1, i+1
    "double_ring": {4: 3, 8: 4, 16: 4},  # i-+1, i-+2 (at 4 workers i+2 and i-2 are the same worker)
    "torus": {4: 2, 8: 3, 16: 4},  # a 2x2, 2x4 and 4x4 grid: up and down coincide on 2 rows
    "hypercube": {4: 2, 8: 3, 16: 4},  # log2 n
    "exponential": {4: 2, 8: 3, 16: 4},  # i - 2^k for 2^k < n
    "complete": {4: 3, 8: 7, 16: 15},
}


@pytest.mark.parametrize("name", sorted(HAND_DEGREES))
def test_mixing_weights_are_the_closed_form_and_sparse_equals_dense(name):
    """Workers read their row from ``mixing_weights`` (O(edges) memory: the simulator builds 50,000
    workers); it must hold exactly the dense matrix's values, and both the closed form of a regular
    graph: 1 / (degree + 1) for every in-neighbour and for the worker itself."""
    for n, degree in HAND_DEGREES[name].items():
        topology = make_topology(name, n)
        expected = 1.0 / (degree + 1)
        dense = topology.mixing_matrix
        for i, (weights, own) in enumerate(topology.mixing_weights):
            assert len(topology.in_neighbors[i]) == degree
            assert weights == pytest.approx({j: expected for j in topology.in_neighbors[i]}, abs=1e-15)
            assert own == pytest.approx(expected, abs=1e-15)
            assert weights == {j: float(dense[i, j]) for j in topology.in_neighbors[i]}  # sparse == dense, bits
            assert own == float(dense[i, i])
            others = set(range(n)) - set(topology.in_neighbors[i]) - {i}
            assert all(dense[i, j] == 0.0 for j in others)
