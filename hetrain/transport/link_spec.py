"""An emulated network: each worker's link bandwidth and latency, shared by runtime and simulator.

``--link-mbps`` and ``--link-latency-ms`` take one number for every worker, or
per-worker values with ``*`` for the rest::

    100                 every worker's link: 100 Mbit/s each way
    0:50,*:1000         worker 0 has 50 Mbit/s, every other worker 1 Gbit/s
    0:50,1:50           workers 0 and 1 50 Mbit/s; the others unconstrained

A worker's link is full duplex: ``mbps`` egress and ``mbps`` ingress. A message
of ``b`` bytes from i to j occupies i's egress for ``8 b / mbps_i`` (messages
leave one after another), reaches j after the path latency, and streams into
j's ingress for ``8 b / mbps_j`` (messages into one worker arrive one after
another); it is delivered when both have passed. The path latency is the larger
of the two workers' latencies (a worker "behind a 50 ms link" is 50 ms from
everyone). A collective (a ring all-reduce, a P-Reduce's exchange) is charged
from the bytes each member sends and receives over its bottleneck member's
link: :func:`LinkSpec.collective_s`. The simulator's network model and the
runtime's emulation (:mod:`hetrain.transport.link`) both read this object.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetrain.errors import UsageError

_FORM = "a number for every worker, or per-worker values such as 0:50,*:1000"


def _parse_values(text: str | None, flag: str, unit: str, *, zero_ok: bool) -> tuple[float | None, dict]:
    """(value for the others, {worker: value}) from ``100`` or ``0:50,*:1000``."""
    if text is None or not str(text).strip():
        return None, {}
    text = str(text).strip()
    default, per_worker = None, {}
    for part in text.split(","):
        part = part.strip()
        who, sep, value_text = part.rpartition(":")
        try:
            value = float(value_text)
        except ValueError:
            raise UsageError(f"malformed {flag} {text!r}: expected {_FORM} ({unit})") from None
        if not (value >= 0 if zero_ok else value > 0) or value != value or value == float("inf"):
            bound = ">= 0" if zero_ok else "> 0"
            raise UsageError(f"{flag} {part!r}: the value must be a finite number {bound} ({unit})")
        if not sep or who.strip() == "*":
            if default is not None:
                raise UsageError(f"{flag} {text!r} gives the value for all workers twice; give it once")
            default = value
            continue
        try:
            worker = int(who)
        except ValueError:
            raise UsageError(f"malformed {flag} {text!r}: {who!r} is not a worker index or *; expected {_FORM}") \
                from None
        if worker < 0 or worker in per_worker:
            raise UsageError(f"{flag} {text!r}: worker {worker} is negative or given twice")
        per_worker[worker] = value
    return default, per_worker


@dataclass(frozen=True)
class LinkSpec:
    """Per-worker link bandwidth (Mbit/s; None: unconstrained) and latency (s); see the module docstring."""

    mbps_text: str | None = None
    latency_text: str | None = None
    default_mbps: float | None = None
    mbps: dict = field(default_factory=dict)
    default_latency_s: float = 0.0
    latency_s: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, mbps: str | float | None = None, latency_ms: str | float | None = None) -> LinkSpec:
        """From ``--link-mbps`` and ``--link-latency-ms`` texts (or numbers); UsageError on a malformed one."""
        mbps_text = None if mbps is None else str(mbps)
        latency_text = None if latency_ms is None else str(latency_ms)
        default_mbps, per_mbps = _parse_values(mbps_text, "--link-mbps", "Mbit/s", zero_ok=False)
        default_ms, per_ms = _parse_values(latency_text, "--link-latency-ms", "milliseconds", zero_ok=True)
        return cls(mbps_text, latency_text, default_mbps, per_mbps, (default_ms or 0.0) / 1e3,
                   {w: ms / 1e3 for w, ms in per_ms.items()})

    @property
    def enabled(self) -> bool:
        """Whether anything is emulated (otherwise links are what the machine gives)."""
        return (self.default_mbps is not None or bool(self.mbps) or self.default_latency_s > 0
                or any(v > 0 for v in self.latency_s.values()))

    def check_workers(self, num_workers: int) -> LinkSpec:
        named = sorted(set(self.mbps) | set(self.latency_s))
        bad = [w for w in named if w >= num_workers]
        if bad:
            raise UsageError(f"the link spec names worker {bad[0]}, but workers are 0..{num_workers - 1}; "
                             "use a worker index below --workers")
        return self

    def bytes_per_s(self, worker: int) -> float | None:
        """Worker's link rate each way in bytes/s (None: unconstrained)."""
        mbps = self.mbps.get(worker, self.default_mbps)
        return None if mbps is None else mbps * 1e6 / 8.0

    def latency_of(self, worker: int) -> float:
        return self.latency_s.get(worker, self.default_latency_s)

    def path_latency_s(self, src: int, dst: int) -> float:
        return max(self.latency_of(src), self.latency_of(dst))

    def transfer_s(self, worker: int, nbytes: float) -> float:
        """Seconds ``nbytes`` occupy ``worker``'s link in one direction."""
        rate = self.bytes_per_s(worker)
        return 0.0 if rate is None else nbytes / rate

    def collective_s(self, members, sent_bytes: float, received_bytes: float, steps: int) -> float:
        """Seconds a collective over ``members`` takes when each sends ``sent_bytes`` and receives
        ``received_bytes`` in ``steps`` message latencies one after another: the bottleneck member's
        link, plus the steps' latency (a ring all-reduce of b bytes over n: 2(n-1)/n b each way, 2(n-1) steps)."""
        members = list(members)
        if len(members) <= 1:
            return 0.0
        busiest = max(max(self.transfer_s(m, sent_bytes), self.transfer_s(m, received_bytes)) for m in members)
        return busiest + steps * max(self.latency_of(m) for m in members)

    def describe(self) -> str:
        parts = []
        if self.mbps_text:
            parts.append(f"{self.mbps_text} Mbit/s")
        if self.latency_text:
            parts.append(f"{self.latency_text} ms latency")
        return ", ".join(parts) or "unconstrained"

    def as_dict(self) -> dict:
        return {"link_mbps": self.mbps_text, "link_latency_ms": self.latency_text}


def ring_allreduce_bytes(num_members: int, nbytes: float) -> float:
    """Bytes each member of a ring all-reduce sends (and receives): 2 (n-1)/n of the buffer."""
    return 0.0 if num_members <= 1 else 2.0 * (num_members - 1) / num_members * nbytes


# ----- the queueing rule, shared by the runtime's emulated link and the simulator's network ----------
# Each endpoint has one egress and one ingress link, each a FIFO: a message leaves when its sender's egress
# is free and streams in when its receiver's ingress is free; it has arrived when both its ingress transfer
# has ended and its last bit (sent at the sender's rate) has come. The same float operations in the same
# order in both callers (hetrain.transport.link.EmulatedLink, hetrain.sim.network.Network).
def book_egress(free: float, now: float, transfer_s: float) -> tuple[float, float]:
    """A message leaving at ``now`` on an egress link free from ``free``: (its start, the link's new free)."""
    start = free if free > now else now
    return start, start + transfer_s


def book_ingress(free: float, first_bit: float, last_bit: float, transfer_s: float) -> tuple[float, float]:
    """A message whose first bit reaches an ingress link (free from ``free``) at ``first_bit`` and whose
    last bit was sent to arrive at ``last_bit``: (its arrival, the link's new free, the same time)."""
    start = free if free > first_bit else first_bit
    arrival = max(start + transfer_s, last_bit)
    return arrival, arrival


STAMP_RESOLUTION_S = 2e-6  # the runtime's stamps are whole microseconds: a fit within it is a fit


def book_ingress_any_order(busy: list[list[float]], first_bit: float, last_bit: float, transfer_s: float) -> float:
    """:func:`book_ingress` for bookings made in any order: ``busy`` holds the ingress link's booked
    ``[start, end)`` intervals, sorted, and the message takes the first idle stretch from ``first_bit`` that
    holds it (added to ``busy``); returns its arrival. Booked in the order of their first bits, messages get
    :func:`book_ingress`'s times; the runtime's receiver threads book as their real receives end, and a
    header-only message (a token) sent just after a large one to the same peer finished its receive first:
    it booked the link from its own first bit, and the large message, queued behind it, paid its transfer
    twice (and was delivered after the token, which one FIFO link never does)."""
    start = first_bit
    low, high = 0, len(busy)  # the first booking that ends after the first bit (ends are sorted: disjoint)
    while low < high:
        middle = (low + high) // 2
        if busy[middle][1] <= start:
            low = middle + 1
        else:
            high = middle
    position = len(busy)
    for index in range(low, len(busy)):
        begin, end = busy[index]
        if max(start + transfer_s, last_bit) <= begin + STAMP_RESOLUTION_S:
            position = index
            break  # fits in the idle stretch before this booking
        start = max(start, end)
    arrival = max(start + transfer_s, last_bit)
    busy.insert(position, [start, arrival])
    return arrival


def book_collective(frees: list[float], now: float, duration_s: float) -> tuple[float, float]:
    """A collective over links free from ``frees`` (every member's egress and ingress): it starts when all
    are free and holds them all for ``duration_s``: (start, end); the caller sets each link free at end."""
    start = now
    for free in frees:
        start = max(start, free)
    return start, start + duration_s
