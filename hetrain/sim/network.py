"""The network model: per-message latency plus bytes over bandwidth, with per-NIC contention.

Every worker has one egress and one ingress link of ``bandwidth_bytes_per_s``.
A message of ``b`` bytes from ``src`` to ``dst`` sent at ``now``:

* leaves when ``src``'s egress link is free: ``t0 = max(now, egress_free[src])``,
  and occupies it for ``b / B`` (so k messages sent together leave one after another);
* reaches ``dst`` after the latency and streams in when ``dst``'s ingress link is free:
  ``arrival = max(t0 + L, ingress_free[dst]) + b / B`` (so k messages into one worker,
  e.g. into a parameter server, arrive one after another).

Uncontended, a message takes ``L + b / B``. Links are FIFO in booking order, so
messages on one (src, dst) channel arrive in the order they were sent, as the
protocols assume.

Collectives are costed from their message patterns: a ring all-reduce of ``b``
bytes over ``n`` members is ``2 (n - 1)`` steps, each sending ``b / n`` bytes to
the ring successor, so ``2 (n - 1) (S + b / (n B))``, where the step latency
``S`` is the message latency ``L`` unless ``collective_step_us`` says otherwise
(with more processes than cores, every step of gloo's ring waits for each
member to be scheduled: ``benchmarks/sim_bench.py network`` measures it). A P-Reduce is what the
runtime does (:mod:`hetrain.protocols.exchange_rule`): for small buffers a direct
exchange, every member sends ``b`` to each of the ``n - 1`` others, charged
``(n - 1) (L + b / B)`` (one latency per peer: posting and receiving each
message costs CPU time; why, with the measurements, in docs/guides/simulator.md);
otherwise a ring all-reduce over its group. A collective starts when every member's links
are free and holds them until it ends (members cannot send anything else
meanwhile).

An emulated network (``--link-mbps``, ``--link-latency-ms``: a
:class:`~hetrain.transport.link_spec.LinkSpec`, the runtime's own) adds to this what the
runtime's emulation adds to the real loopback: a message's path latency, its
bytes over each end's own link rate (a constrained worker's link instead of the
default bandwidth), and for a collective :meth:`LinkSpec.collective_s` of the
bytes each member sends.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetrain.protocols.exchange_rule import uses_direct_exchange
from hetrain.transport.link_spec import (
    LinkSpec,
    book_collective,
    book_egress,
    book_ingress,
    ring_allreduce_bytes,
)

# Loopback gloo on the 2-core development machine: one-way send/recv of 8 bytes took 46 us
# between 2 processes and 150-180 us with 8 processes sharing the cores; 10 MB moved at
# 2.8-3.5 GB/s (`benchmarks/sim_bench.py network` measures latencies on any machine).
DEFAULT_LATENCY_US = 150.0
DEFAULT_GG_SERVICE_US = 20.0  # one request handled by the Group Generator service (pure-Python logic)
DEFAULT_BANDWIDTH_GBPS = 24.0  # gigabits per second (3 GB/s)
TOKEN_BYTES = 8  # a token or control message


@dataclass(frozen=True)
class NetworkParams:
    """Link parameters. ``bandwidth_gbps`` is in gigabits per second (as NICs are sold)."""

    latency_us: float = DEFAULT_LATENCY_US
    bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS
    new_group_ms: float = 5.0  # creating a communicator (P-Reduce cache miss), from docs/guides/simulator.md
    gg_service_us: float = DEFAULT_GG_SERVICE_US  # a Group Generator's time per request (docs/guides/simulator.md)
    collective_step_us: float | None = None  # one step of a ring all-reduce; None: latency_us

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6

    @property
    def collective_step_s(self) -> float:
        return (self.latency_us if self.collective_step_us is None else self.collective_step_us) * 1e-6

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9 / 8.0

    def as_dict(self) -> dict:
        return {"latency_us": self.latency_us, "bandwidth_gbps": self.bandwidth_gbps,
                "new_group_ms": self.new_group_ms, "gg_service_us": self.gg_service_us,
                "collective_step_us": self.latency_us if self.collective_step_us is None else self.collective_step_us,
                "contention": "per-NIC FIFO (egress and ingress)"}


def ring_allreduce_s(num_members: int, nbytes: float, params: NetworkParams) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` over ``num_members`` uncontended workers."""
    if num_members <= 1:
        return 0.0
    n = num_members
    return 2 * (n - 1) * (params.collective_step_s + nbytes / (n * params.bytes_per_s))


def direct_exchange_s(num_members: int, nbytes: float, params: NetworkParams) -> float:
    """Seconds for a direct exchange of ``nbytes`` among ``num_members`` uncontended workers."""
    return (num_members - 1) * (params.latency_s + nbytes / params.bytes_per_s)


def preduce_s(num_members: int, nbytes: float, params: NetworkParams) -> float:
    """Seconds for a P-Reduce of ``nbytes`` over ``num_members`` uncontended workers (as the runtime runs it)."""
    if num_members <= 1:
        return 0.0
    if uses_direct_exchange(nbytes, num_members):
        return direct_exchange_s(num_members, nbytes, params)
    return ring_allreduce_s(num_members, nbytes, params)


class Network:
    """Link state of ``num_workers`` workers (plus any extra endpoints, e.g. a server)."""

    def __init__(self, params: NetworkParams, num_endpoints: int, link: LinkSpec | None = None):
        self.params = params
        self.link = link if link is not None and link.enabled else None
        self.latency_s = params.latency_s
        self.bytes_per_s = params.bytes_per_s
        self.egress_free = [0.0] * num_endpoints
        self.ingress_free = [0.0] * num_endpoints
        self.messages = 0
        self.bytes_sent = 0.0

    def send(self, now: float, src: int, dst: int, nbytes: float) -> float:
        """Book a message on src's egress and dst's ingress; return its arrival time (s)."""
        transfer = in_transfer = nbytes / self.bytes_per_s
        latency = self.latency_s
        if self.link is not None:
            transfer += self.link.transfer_s(src, nbytes)
            in_transfer += self.link.transfer_s(dst, nbytes)
            latency += self.link.path_latency_s(src, dst)
        t0, self.egress_free[src] = book_egress(self.egress_free[src], now, transfer)
        arrival, self.ingress_free[dst] = book_ingress(self.ingress_free[dst], t0 + latency, t0 + transfer + latency,
                                                       in_transfer)
        self.messages += 1
        self.bytes_sent += nbytes
        return arrival

    def collective(self, now: float, members, nbytes: float, preduce: bool = False) -> tuple[float, float]:
        """Book a ring all-reduce (or, ``preduce``, a P-Reduce) over ``members``; return (start_s, end_s)."""
        n = len(members)
        direct = preduce and n > 1 and uses_direct_exchange(nbytes, n)
        duration = (direct_exchange_s if direct else ring_allreduce_s)(n, nbytes, self.params)
        start, end = book_collective([free for m in members for free in (self.egress_free[m], self.ingress_free[m])],
                                     now, duration)
        if self.link is not None and n > 1:  # what the runtime's emulation holds every member for
            sent = (n - 1) * nbytes if direct else ring_allreduce_bytes(n, nbytes)
            end += self.link.collective_s(members, sent, sent, 1 if direct else 2 * (n - 1))
        for m in members:
            self.egress_free[m] = end
            self.ingress_free[m] = end
        self.messages += (n - 1) * n if direct else 2 * (n - 1) * n
        self.bytes_sent += (n - 1) * n * nbytes if direct else 2 * (n - 1) * nbytes
        return start, end
