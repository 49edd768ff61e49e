"""Serving a group scheduler (the Group Generator, AD-PSGD's pairing) to a real job.

One :class:`GGServer` per job runs as threads beside rank 0: a TCP socket on a
port the OS picks, its address published through the job's c10d store, so no
port is fixed. It binds 127.0.0.1 unless the job spans machines (see
:func:`gg_bind_address`; ``HETRAIN_GG_HOST`` overrides). Messages are one JSON
object per line. A lock serialises requests, so the pure scheduler (any
:class:`~hetrain.protocols.ledger.GroupScheduler`) sees them one at a time,
stamped with the server's clock. Rank 0 talks to the scheduler in-process.

Only the job's workers may talk to it: a connection's first line must be
``{"op": "hello", "secret": ...}`` with the job's secret
(:mod:`hetrain.transport.job_secret`), which never travels through the store (anyone
who reaches the store may read it): a local or Ray job's launcher hands it to
its workers, and the ranks of a torchrun job take it from
``$HETRAIN_JOB_SECRET`` or a file only the user can read
(:mod:`hetrain.groups.gg_secret`). Only the address (and that file's name) goes
through the store. A connection that fails the handshake, or sends a line that
is not a JSON object, gets one error line and is closed; the job goes on.
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
from hetrain.groups import gg_secret
from hetrain.protocols.ledger import Group, GroupScheduler
from hetrain.transport import job_secret

ADDRESS_KEY = "gg_address"
HELLO_TIMEOUT_S = 30.0  # how long a new connection may take to send its hello
MAX_LINE_BYTES = 65536  # a request is a few dozen bytes; longer lines are refused unread


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
    """Serialises messages to a :class:`GroupScheduler`, stamped with this host's clock."""

    def __init__(self, scheduler: GroupScheduler):
        self.scheduler = scheduler
        self.served = 0
        self._lock = threading.Lock()
        self._t0 = time.monotonic()

    def handle(self, message: dict) -> dict:
        """Answer one message: request, leave, status or stats."""
        op = message.get("op")
        with self._lock:
            now_s = time.monotonic() - self._t0
            try:
                if op == "request":
                    groups = self.scheduler.request(int(message["worker"]), now_s)
                elif op == "leave":
                    groups = self.scheduler.leave(int(message["worker"]), now_s)
                elif op == "rejoin":  # the launcher: a replacement joined (respawn)
                    self.scheduler.rejoin(int(message["worker"]), int(message["incarnation"]))
                    groups = []
                elif op == "settled":  # a replacement took a model
                    self.scheduler.settle(int(message["worker"]))
                    groups = []
                elif op == "status":
                    return {"left": sorted(self.scheduler.left()), "served": self.served}
                elif op == "stats":
                    return dict(self.scheduler.stats())
                else:
                    return {"error": f"unknown operation {op!r}"}
            except (KeyError, ValueError, TypeError) as exc:
                return {"error": f"bad {op} message: {exc}"}
            self.served += 1
            return {"groups": [g.as_list() for g in groups]}

    def close(self) -> None:
        pass


class GGServer(SchedulerHost):
    """A :class:`SchedulerHost` reachable over TCP by clients that know the job's secret.

    ``secret``: the job's (a launcher's); None: the server is rank 0 of a job without hetrain's launcher,
    and takes it as :func:`hetrain.groups.gg_secret.rank0_secret` says (refused when it would listen
    beyond this machine without ``$HETRAIN_JOB_SECRET``)."""

    def __init__(self, scheduler: GroupScheduler, host: str | None = None, multi_node: bool = False,
                 secret: str | None = None):
        super().__init__(scheduler)
        bind, self.host = (host, host) if host else gg_bind_address(multi_node)
        self.secret_file = None
        if secret is None:
            secret, self.secret_file = gg_secret.rank0_secret(bind, _is_loopback(bind))
        self.secret = secret
        self.rejected = 0  # connections refused (bad handshake or malformed line)
        self._closed = False
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((bind, 0))
        self._sock.listen(256)
        self.port = self._sock.getsockname()[1]
        self._connections: set[socket.socket] = set()
        threading.Thread(target=self._accept_loop, name="hetrain-gg", daemon=True).start()

    def publish(self, store) -> None:
        """Publish the name of the secret's file ("" when the environment gives the secret), then the address
        (clients wait for the address); never the secret."""
        store.set(gg_secret.FILE_KEY, os.path.basename(self.secret_file) if self.secret_file else "")
        store.set(ADDRESS_KEY, f"{self.host}:{self.port}")

    def close(self) -> None:
        """Stop listening and drop every connection (a shutdown first: on Linux a plain close leaves a
        socket that another thread is blocked in accept() on still listening)."""
        self._closed = True
        if self.secret_file is not None:
            try:
                os.unlink(self.secret_file)
            except OSError:
                pass
        for sock in [self._sock, *list(self._connections)]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn, conn.makefile("rwb") as stream:
                conn.settimeout(HELLO_TIMEOUT_S)  # a peer that says nothing holds no thread for long
                hello = _read_message(stream)
                conn.settimeout(None)
                if not (isinstance(hello, dict) and hello.get("op") == "hello"
                        and job_secret.same_secret(hello.get("secret"), self.secret)):
                    self._refuse(stream, "not a worker of this job (the first line must be a hello with the job's secret)")
                    return
                _write(stream, {"ok": True})
                while True:
                    message = _read_message(stream)
                    if message is None:
                        return
                    if not isinstance(message, dict):
                        self._refuse(stream, "each line must be one JSON object")
                        return
                    _write(stream, self.handle(message))
        except OSError:  # a worker went away; its own process reports why
            return
        finally:
            self._connections.discard(conn)

    def _refuse(self, stream, why: str) -> None:
        self.rejected += 1
        try:
            _write(stream, {"error": why})
        except OSError:
            pass


def _read_message(stream):
    """The next line as JSON (None at end of stream; a non-dict marker for a malformed line)."""
    line = stream.readline(MAX_LINE_BYTES + 1)
    if not line:
        return None
    if len(line) > MAX_LINE_BYTES or not line.endswith(b"\n"):
        return "malformed"
    try:
        return json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return "malformed"


def _write(stream, reply: dict) -> None:
    stream.write(json.dumps(reply).encode() + b"\n")
    stream.flush()


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
    """A worker's connection to the job's GG; every wait is bounded by ``timeout_s``. ``link``
    (an :class:`~hetrain.transport.link.EmulatedLink`) makes each call pay the emulated network
    toward ``server_rank`` (None: a server beside the launcher)."""

    link = None
    server_rank: int | None = 0

    def __init__(self, worker: int, store, timeout_s: float):
        try:
            store.wait([ADDRESS_KEY], datetime.timedelta(seconds=timeout_s))
            address = store.get(ADDRESS_KEY).decode()
            secret_file = store.get(gg_secret.FILE_KEY).decode()
        except Exception as exc:  # c10d raises its own store timeout types
            raise WorkerError(
                f"worker {worker} waited {timeout_s:.0f} s for the Group Generator's address "
                f"(rank 0 publishes it): {exc}"
            ) from None
        self._connect(worker, address, gg_secret.worker_secret(worker, secret_file), timeout_s)

    @classmethod
    def to(cls, worker: int, address: str, secret: str, *, timeout_s: float) -> SocketClient:
        """A client of the GG at ``address`` (host:port) that knows the job's ``secret``."""
        client = cls.__new__(cls)
        client._connect(worker, address, secret, timeout_s)
        return client

    def _connect(self, worker: int, address: str, secret: str, timeout_s: float) -> None:
        self.worker = worker
        self.timeout_s = timeout_s
        host, port = address.rsplit(":", 1)
        try:
            self._sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        except OSError as exc:
            raise WorkerError(f"worker {worker} could not reach the Group Generator at {host}:{port}: {exc}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._stream = self._sock.makefile("rwb")
        if "error" in self._call({"op": "hello", "secret": secret}):
            raise WorkerError(f"worker {worker}: the Group Generator refused this job's secret")

    def _call(self, message: dict) -> dict:
        request = json.dumps(message).encode() + b"\n"
        try:
            self._stream.write(request)
            self._stream.flush()
            line = self._stream.readline()
        except (socket.timeout, OSError) as exc:
            raise WorkerError(
                f"worker {self.worker} waited for the Group Generator to answer {message['op']} "
                f"(timeout {self.timeout_s:.0f} s): {exc}"
            ) from None
        if not line:
            raise WorkerError(f"worker {self.worker}: the Group Generator closed the connection during {message['op']}")
        if self.link is not None:
            self.link.round_trip(self.server_rank, len(request), len(line))
        return json.loads(line)

    def close(self) -> None:
        try:
            self._stream.close()
            self._sock.close()
        except OSError:
            pass
