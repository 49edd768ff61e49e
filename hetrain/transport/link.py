"""One worker's emulated link (:class:`~hetrain.transport.link_spec.LinkSpec`) and its byte counters.

Every protocol sends through its worker's :class:`EmulatedLink`, which counts
the bytes sent and received and, when the spec constrains the link, charges
the time the bytes would take:

* point to point, the sender books the message on its egress clock
  (:meth:`EmulatedLink.depart`: no sleep, a real NIC sends while the worker
  computes) and stamps the message with two wall-clock times, when its first
  bit reaches the receiver and when its last bit left the sender plus the
  latency; the receiver books it on its ingress clock and holds it until both
  have passed (:meth:`EmulatedLink.arrive`, on the receiving thread), so a
  message is delivered ``latency + bytes / bandwidth`` after it was sent, later
  when either side's link is busy with other messages;
* a collective (a P-Reduce, a DDP bucket's all-reduce) holds every member until
  :meth:`LinkSpec.collective_s` has passed after the real operation
  (:meth:`EmulatedLink.collective`; every member computes the same time).

Stamps are ``time.time()`` in microseconds, so sender and receiver must share a
clock: processes on one machine do; across machines, emulate only where clocks
are synchronised (NTP), or measure the real network instead. The real transfer
(loopback: microseconds to milliseconds) comes on top of the emulated one.
"""

from __future__ import annotations

import threading
import time

from hetrain.transport.link_spec import LinkSpec, book_collective, book_egress, book_ingress_any_order

NO_STAMPS = (0, 0)  # a message sent without emulation
KEEP_BOOKINGS_S = 60.0  # ingress bookings ended this long before a new message's first bit are forgotten


class EmulatedLink:
    """Worker ``rank``'s link under ``spec`` (None or an unconstrained spec: count bytes, never sleep)."""

    def __init__(self, spec: LinkSpec | None, rank: int):
        self.spec = spec if spec is not None and spec.enabled else None
        self.rank = rank
        self._lock = threading.Lock()
        self._egress_free = 0.0
        self._ingress_free = 0.0  # after every booking (a collective starts after it)
        self._ingress_busy: list[list[float]] = []  # the ingress link's bookings, [start, end), sorted
        self.bytes_sent = 0
        self.bytes_received = 0
        self.messages_sent = 0
        self.egress_s = 0.0  # seconds the egress direction carried bytes (emulated)
        self.ingress_s = 0.0
        self.held_s = 0.0  # seconds threads of this worker were held for the link (any thread)

    @property
    def emulated(self) -> bool:
        return self.spec is not None

    def depart(self, nbytes: int, dst: int) -> tuple[int, int]:
        """Count and book a message of ``nbytes`` to ``dst``; return its stamps (microseconds)."""
        with self._lock:
            self.bytes_sent += nbytes
            self.messages_sent += 1
            if self.spec is None:
                return NO_STAMPS
            transfer = self.spec.transfer_s(self.rank, nbytes)
            start, self._egress_free = book_egress(self._egress_free, time.time(), transfer)
            self.egress_s += transfer
        latency = self.spec.path_latency_s(self.rank, dst)
        return int((start + latency) * 1e6), int((start + transfer + latency) * 1e6)

    def unsent(self, nbytes: int, dst: int, stamps) -> None:
        """A message :meth:`depart` booked to ``dst`` never left (its send failed at once): uncount it, and give
        its egress time back where nothing was booked after it."""
        with self._lock:
            self.bytes_sent -= nbytes
            self.messages_sent -= 1
            if self.spec is None or tuple(stamps) == NO_STAMPS:
                return
            transfer = self.spec.transfer_s(self.rank, nbytes)
            self.egress_s -= transfer
            start = stamps[0] / 1e6 - self.spec.path_latency_s(self.rank, dst)
            if abs(self._egress_free - (start + transfer)) < 1e-5:  # the last booking: free it
                self._egress_free = start

    def arrive(self, nbytes: int, src: int, stamps) -> None:
        """Count a received message and hold the calling thread until the link would have delivered it."""
        first_bit_us, sent_us = (int(v) for v in stamps)
        with self._lock:
            self.bytes_received += nbytes
            if self.spec is None or (first_bit_us, sent_us) == NO_STAMPS:
                return
            transfer = self.spec.transfer_s(self.rank, nbytes)
            first_bit = first_bit_us / 1e6
            busy = self._ingress_busy
            while busy and busy[0][1] < first_bit - KEEP_BOOKINGS_S:
                busy.pop(0)
            # each receiver thread books as its real receive ends, not in the order the messages were sent
            arrival = book_ingress_any_order(busy, first_bit, sent_us / 1e6, transfer)
            self._ingress_free = max(self._ingress_free, arrival)
            self.ingress_s += transfer
        self._hold_until(arrival)

    def collective(self, members, sent_bytes: float, received_bytes: float, steps: int) -> None:
        """Count a collective's bytes and hold the caller for its emulated duration (after the real one)."""
        with self._lock:
            self.bytes_sent += int(sent_bytes)
            self.bytes_received += int(received_bytes)
            if self.spec is None:
                return
            duration = self.spec.collective_s(members, sent_bytes, received_bytes, steps)
            start, end = book_collective([self._egress_free, self._ingress_free], time.time(), duration)
            self._egress_free = self._ingress_free = end
            self._ingress_busy.append([start, end])  # after every booking so far: the list stays sorted
            self.egress_s += duration
            self.ingress_s += duration
        self._hold_until(end)

    def round_trip(self, peer: int | None, sent_bytes: int, received_bytes: int) -> None:
        """A request to ``peer`` and its answer (the Group Generator's; ``peer`` None: a server off the
        workers, the launcher): count the bytes and hold the caller for two path latencies and both
        transfers. Control messages are small: they do not queue behind the links' model traffic."""
        with self._lock:
            self.bytes_sent += int(sent_bytes)
            self.bytes_received += int(received_bytes)
            if self.spec is None:
                return
            ends = [self.rank] if peer is None or peer == self.rank else [self.rank, peer]
            duration = (max(self.spec.transfer_s(m, sent_bytes) for m in ends)
                        + max(self.spec.transfer_s(m, received_bytes) for m in ends)
                        + 2 * max(self.spec.latency_of(m) for m in ends))
        self._hold_until(time.time() + duration)

    def _hold_until(self, wall_time_s: float) -> None:
        delay = wall_time_s - time.time()
        if delay > 0:
            time.sleep(delay)
            with self._lock:
                self.held_s += delay

    def counters(self) -> dict:
        """``bytes_sent``, ``bytes_received``, ``link_s`` (the busier direction's emulated seconds), ..."""
        with self._lock:
            return {"bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                    "messages_sent": self.messages_sent, "link_s": max(self.egress_s, self.ingress_s),
                    "link_egress_s": self.egress_s, "link_ingress_s": self.ingress_s,
                    "link_held_s": self.held_s}
