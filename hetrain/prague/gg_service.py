"""Serving a group scheduler (the Group Generator, AD-PSGD's pairing) to a real job.

One :class:`GGServer` per job runs as threads beside rank 0: a TCP socket on a
port the OS picks, its address published through the job's c10d store, so no
port is fixed. It binds 127.0.0.1 unless the job spans machines (see
:func:`gg_bind_address`; ``HETRAIN_GG_HOST`` overrides). Messages are one JSON
object per line. A lock serialises requests, so the pure scheduler sees them one at a time, stamped
with the server's clock. Rank 0 talks to the scheduler in-process.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import socket
import threading
import time

from hetrain.errors import WorkerError
from hetrain.prague.ledger import Group

ADDRESS_KEY = "prague/gg_address"


def gg_bind_address(multi_node: bool, env=None) -> tuple[str, str]:
    """(address to bind, address to publish) for the GG service.

    ``HETRAIN_GG_HOST`` wins (``0.0.0.0`` publishes this machine's address
    toward the job's master). Otherwise a job that spans machines (``multi_node``:
    fewer ranks per node than in the job, and torchrun's ``MASTER_ADDR`` not a
    loopback address) binds all interfaces and publishes the address other
    machines reach this one by; everything else stays on 127.0.0.1.
    """
    env = os.environ if env is None else env
    master = env.get("MASTER_ADDR", "")
    host = env.get("HETRAIN_GG_HOST")
    if host is None:
        host = "0.0.0.0" if multi_node and master and not _is_loopback(master) else "127.0.0.1"
    return host, (_address_toward(master) if host == "0.0.0.0" else host)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _address_toward(peer: str) -> str:
    """This machine's IP on the route to ``peer`` (or the default route; a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((peer or "8.8.8.8", 9))
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()


class SchedulerHost:
    """Serialises messages to ``scheduler`` (anything with request/leave/not_started/stats and a ``ledger``)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.served = 0
        self._lock = threading.Lock()
        self._t0 = time.monotonic()

    def handle(self, message: dict) -> dict:
        """Answer one message: request, leave, status, not_started or stats."""
        op = message.get("op")
        with self._lock:
            now_s = time.monotonic() - self._t0
            try:
                if op == "request":
                    groups = self.scheduler.request(int(message["worker"]), now_s)
                elif op == "leave":
                    groups = self.scheduler.leave(int(message["worker"]), now_s)
                elif op == "status":
                    return {"left": sorted(self.scheduler.ledger.left), "served": self.served}
                elif op == "not_started":
                    return {"missing": self.scheduler.not_started(int(message["seq"]))}
                elif op == "stats":
                    return dict(self.scheduler.stats())
                else:
                    return {"error": f"unknown operation {op!r}"}
            except (KeyError, ValueError) as exc:
                return {"error": str(exc)}
            self.served += 1
            return {"groups": [g.as_list() for g in groups]}

    def close(self) -> None:
        pass


class GGServer(SchedulerHost):
    """A :class:`SchedulerHost` reachable over TCP (threads beside rank 0)."""

    def __init__(self, scheduler, host: str | None = None, multi_node: bool = False):
        super().__init__(scheduler)
        self._closed = False
        bind, self.host = (host, host) if host else gg_bind_address(multi_node)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((bind, 0))
        self._sock.listen(256)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept_loop, name="hetrain-gg", daemon=True).start()

    def publish(self, store, key: str = ADDRESS_KEY) -> None:
        store.set(key, f"{self.host}:{self.port}")

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn, conn.makefile("rwb") as stream:
                for line in stream:
                    reply = self.handle(json.loads(line))
                    stream.write(json.dumps(reply).encode() + b"\n")
                    stream.flush()
        except OSError:  # a worker went away; its own process reports why
            return


class _Client:
    """Shared client API; subclasses implement ``_call``."""

    worker: int

    def call(self, op: str, **fields) -> dict:
        reply = self._call({"op": op, "worker": self.worker, **fields})
        if "error" in reply:
            raise WorkerError(f"worker {self.worker}: the Group Generator refused {op}: {reply['error']}")
        return reply

    def request(self) -> list[Group]:
        return [Group.from_list(g) for g in self.call("request")["groups"]]

    def leave(self) -> list[Group]:
        return [Group.from_list(g) for g in self.call("leave")["groups"]]

    def status(self) -> dict:
        return self.call("status")

    def not_started(self, seq: int) -> list[int]:
        return list(self.call("not_started", seq=seq)["missing"])

    def stats(self) -> dict:
        return self.call("stats")

    def close(self) -> None:
        pass


class LocalClient(_Client):
    """In-process access to a scheduler host (rank 0, static mode, one-worker jobs)."""

    def __init__(self, worker: int, server: SchedulerHost):
        self.worker = worker
        self.server = server

    def _call(self, message: dict) -> dict:
        return self.server.handle(message)


class SocketClient(_Client):
    """A worker's connection to the job's GG; every wait is bounded by ``timeout_s``."""

    def __init__(self, worker: int, store, timeout_s: float, key: str = ADDRESS_KEY):
        self.worker = worker
        self.timeout_s = timeout_s
        try:
            store.wait([key], datetime.timedelta(seconds=timeout_s))
            host, port = store.get(key).decode().rsplit(":", 1)
        except Exception as exc:  # c10d raises its own store timeout types
            raise WorkerError(
                f"worker {worker} waited {timeout_s:.0f} s for the Group Generator's address "
                f"(rank 0 publishes it): {exc}"
            ) from None
        try:
            self._sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        except OSError as exc:
            raise WorkerError(f"worker {worker} could not reach the Group Generator at {host}:{port}: {exc}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._stream = self._sock.makefile("rwb")

    def _call(self, message: dict) -> dict:
        try:
            self._stream.write(json.dumps(message).encode() + b"\n")
            self._stream.flush()
            line = self._stream.readline()
        except (socket.timeout, OSError) as exc:
            raise WorkerError(
                f"worker {self.worker} waited for the Group Generator to answer {message['op']} "
                f"(timeout {self.timeout_s:.0f} s): {exc}"
            ) from None
        if not line:
            raise WorkerError(f"worker {self.worker}: the Group Generator closed the connection during {message['op']}")
        return json.loads(line)

    def close(self) -> None:
        try:
            self._stream.close()
            self._sock.close()
        except OSError:
            pass
