"""Which nodes of the Ray cluster are being drained: their workers leave the job before the node goes.

Ray warns no actor before its node goes: a node removed gracefully (its raylet SIGTERMed, as
``Cluster.remove_node`` does) is marked dead at once and its actors' processes end with it, no signal
first; a node being drained (``ray drain-node``, or the autoscaler's drain before it ends an idle or
preempted node) takes no new work and keeps running its actors until whoever drains it ends it, and nothing
reaches them meanwhile. What does show the drain is the cluster's control store (GCS): the driver asks it
every :data:`DRAIN_POLL_S` (one small call) and asks the workers on a draining node to leave
(docs/decisions/ray-jobs-grow-and-drain.md).

The call is Ray's own (what Ray Serve uses to move replicas off draining nodes), reached through
``ray._private``: a Ray without it reads as draining nothing, and those nodes' workers die with them
instead (the deaths the job already survives).
"""

from __future__ import annotations

DRAIN_POLL_S = 1.0
_TIMEOUT_S = 5.0


def draining_nodes() -> set[str]:
    """The hex ids of the nodes being drained now (empty when this Ray cannot say)."""
    try:
        import ray

        client = ray._private.worker.global_worker.gcs_client
        return set(client.get_draining_nodes(timeout=_TIMEOUT_S))
    except Exception:  # noqa: BLE001 - an older or newer Ray, or the GCS busy: no drain seen this time
        return set()
