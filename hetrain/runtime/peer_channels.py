"""Tagged point-to-point messages between neighbours over torch.distributed.

Each message is an int64 header ``[kind, iteration, count]`` optionally
followed by a payload (a flat model buffer). One receiver thread per
(peer, channel) posts receives and hands each message to a callback; sends are
asynchronous (``isend``), so communication overlaps the next computation.
Messages between two workers on one channel arrive in the order they were sent.

The channels use a process group of their own: gloo numbers collective
operations with tags counting up from 0 on each group, so point-to-point
messages with fixed tags on the default group would sooner or later be matched
against a collective's messages. Creating the group is collective: every worker
constructs its PeerChannels at the same point.

Every receive waits at most ``timeout_s``; a receiver that times out or fails
records an error naming the peer, which the protocol raises in the main thread.
Sends to each peer go through a :class:`~hetrain.runtime.send_window.SendWindow`:
at most ``max_in_flight`` messages outstanding per peer, each payload released
as soon as its send completes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from hetrain.runtime.context import WorkerContext
from hetrain.runtime.send_window import DEFAULT_MAX_IN_FLIGHT, SendWindow

UPDATE, TOKEN, STOP = 0, 1, 2
CHANNEL_TAGS = {"update": 11, "token": 12}
HANDSHAKE_TAG = 13
RECEIVER_TIMEOUT_FACTOR = 3


class PeerChannels:
    def __init__(self, ctx: WorkerContext, payload_numel: int, payload_dtype: torch.dtype,
                 on_message: Callable[[str, int, int, int, int, torch.Tensor | None], None],
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT):
        """``on_message(channel, src, kind, iteration, count, payload)`` runs on receiver threads;
        ``max_in_flight`` bounds the messages (both channels) outstanding to each peer."""
        self.ctx = ctx
        self.payload_numel = payload_numel
        self.payload_dtype = payload_dtype
        self.on_message = on_message
        self.errors: list[str] = []
        self._threads: list[threading.Thread] = []
        self.max_in_flight = max_in_flight
        self._windows: dict[int, SendWindow] = {}
        self.group = dist.new_group(timeout=ctx.timeout * RECEIVER_TIMEOUT_FACTOR)

    def handshake(self, out_neighbors: list[int], in_neighbors: list[int]) -> None:
        """Exchange one small message with every neighbour before training starts.

        gloo connects a pair of workers on its first message; doing that here keeps
        connection set-up (about a second for 8 workers on 2 cores) out of the
        measured training time, as DDP's constructor does for All-Reduce.
        """
        token = torch.zeros(1, dtype=torch.int64, device=self.ctx.device)
        works = [dist.isend(token, dst=dst, tag=HANDSHAKE_TAG, group=self.group) for dst in out_neighbors]
        inbox = [torch.empty(1, dtype=torch.int64, device=self.ctx.device) for _ in in_neighbors]
        works += [dist.irecv(buf, src=src, tag=HANDSHAKE_TAG, group=self.group)
                  for buf, src in zip(inbox, in_neighbors)]
        try:
            for work in works:
                work.wait(timeout=self.ctx.timeout)
        except Exception as exc:
            raise RuntimeError(
                f"worker {self.ctx.rank} could not reach its neighbours {sorted(set(out_neighbors + in_neighbors))} "
                f"within {self.ctx.timeout_s:.0f} s: {str(exc).splitlines()[0][:160]}"
            ) from None

    def listen(self, channel: str, sources: list[int]) -> None:
        for src in sources:
            thread = threading.Thread(target=self._receive_loop, args=(channel, src), daemon=True,
                                      name=f"hetrain-recv-{channel}-{src}")
            thread.start()
            self._threads.append(thread)

    def _receive_loop(self, channel: str, src: int) -> None:
        tag = CHANNEL_TAGS[channel]
        device = self.ctx.device
        try:
            while True:
                header = torch.empty(3, dtype=torch.int64, device=device)
                self._recv(header, src, tag, f"a {channel} header")
                kind, iteration, count = (int(v) for v in header.tolist())
                payload = None
                if kind == UPDATE:
                    payload = torch.empty(self.payload_numel, dtype=self.payload_dtype, device=device)
                    self._recv(payload, src, tag, f"the model of iteration {iteration}")
                self.on_message(channel, src, kind, iteration, count, payload)
                if kind == STOP:
                    return
        except Exception as exc:  # surfaced in the main thread
            self.errors.append(str(exc))
            self.on_message(channel, src, -1, -1, 0, None)

    def _recv(self, tensor: torch.Tensor, src: int, tag: int, what: str) -> None:
        # Receivers may idle while their peer waits on others; the main thread's own, more
        # informative timeout fires first, this one only catches a peer that vanished.
        work = dist.irecv(tensor, src=src, tag=tag, group=self.group)
        try:
            work.wait(timeout=RECEIVER_TIMEOUT_FACTOR * self.ctx.timeout)
        except Exception as exc:
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if "imed out" in detail or "timeout" in detail.lower():
                raise RuntimeError(
                    f"worker {self.ctx.rank} waited more than {RECEIVER_TIMEOUT_FACTOR * self.ctx.timeout_s:.0f} s "
                    f"for {what} from worker {src}"
                ) from None
            raise RuntimeError(
                f"worker {self.ctx.rank} lost worker {src} while waiting for {what} (did it exit?): {detail[:160]}"
            ) from None

    def send(self, channel: str, dsts: list[int], kind: int, iteration: int = 0, count: int = 0,
             payload: torch.Tensor | None = None) -> None:
        """Post one message to each of ``dsts``; blocks only while a peer has a full window."""
        tag = CHANNEL_TAGS[channel]
        header = torch.tensor([kind, iteration, count], dtype=torch.int64, device=self.ctx.device)
        for dst in dsts:
            def start(dst=dst):
                works = [dist.isend(header, dst=dst, tag=tag, group=self.group)]
                if payload is not None:
                    works.append(dist.isend(payload, dst=dst, tag=tag, group=self.group))
                return works

            self._window(dst).post(start, header, payload)

    def _window(self, dst: int) -> SendWindow:
        window = self._windows.get(dst)
        if window is None:
            window = SendWindow(f"worker {self.ctx.rank}", dst, max_in_flight=self.max_in_flight,
                                timeout_s=self.ctx.timeout_s)
            self._windows[dst] = window
        return window

    def in_flight(self) -> int:
        """Messages posted and not yet seen to complete, over all peers."""
        return sum(w.in_flight for w in self._windows.values())

    def max_in_flight_seen(self) -> int:
        """The most messages ever outstanding to one peer."""
        return max((w.max_seen_in_flight for w in self._windows.values()), default=0)

    def flush(self) -> None:
        """Wait until every send has left (bounded by the timeout)."""
        for window in self._windows.values():
            window.drain()

    def join(self) -> None:
        """Wait for every receiver thread to see its peer's STOP (bounded by the timeout)."""
        for thread in self._threads:
            thread.join(timeout=self.ctx.timeout_s)
            if thread.is_alive():
                raise RuntimeError(
                    f"worker {self.ctx.rank}: {thread.name} still waiting after {self.ctx.timeout_s:.0f} s "
                    "for its peer to stop"
                )

    def close(self) -> None:
        """Destroy the channels' process group now (after join and flush), not at interpreter exit:
        a gloo group left to be destroyed during finalization can abort the process."""
        for window in self._windows.values():
            window.close()
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None
