"""Ray clusters on this machine for the Ray launcher's tests (Ray's own harness, ``ray.cluster_utils``).

Every node listens on loopback only (``node_ip_address="127.0.0.1"``, and
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, without which Ray binds the machine's external address), with
no dashboard and a small object store. A fixture always shuts Ray and the cluster down. The actors
import the test's worker functions from this directory (``PYTHONPATH``).
"""

import os
from pathlib import Path

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read as Ray is imported: set before
try:
    import ray
except ImportError:  # the test modules skip themselves (pytest.importorskip)
    ray = None

from ray_nodes import node_args  # noqa: E402 (tests/ray is on sys.path: pytest's rootdir-relative import)

HERE = str(Path(__file__).parent)


@pytest.fixture
def make_cluster(monkeypatch, processes):
    """``make_cluster(head_cpus, *node_cpus)``: a cluster whose head has ``head_cpus`` CPUs (0: the driver's
    node only, no worker lands there) and one more node per ``node_cpus``."""
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p))
    clusters = []

    def make(head_cpus: int, *node_cpus: int):
        cluster = Cluster(initialize_head=True, head_node_args=node_args(head_cpus, include_dashboard=False))
        clusters.append(cluster)
        for cpus in node_cpus:
            cluster.add_node(**node_args(cpus))
        cluster.wait_for_nodes()
        return cluster

    try:
        yield make
    finally:
        ray.shutdown()
        for cluster in clusters:
            cluster.shutdown()


@pytest.fixture
def joined(make_cluster):
    """``joined(head_cpus, *node_cpus)``: a cluster this test process has joined as its driver."""
    def join(head_cpus: int, *node_cpus: int):
        cluster = make_cluster(head_cpus, *node_cpus)
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1")
        return cluster

    return join
