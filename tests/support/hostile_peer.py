"""A stranger on a job's ports, for the hostile-peer tests (tests/ray, tests/jobs): found from outside
(the job's processes' listening sockets), each port gets garbage, an oversized frame, pickles whose
unpickling would create a marker file, and, where it speaks the port's protocol (a c10d store, the
Group Generator's lines), forged and replayed messages. Nothing here needs the job's secret."""

from __future__ import annotations

import datetime
import json
import os
import pickle
import socket

import psutil

OVERSIZED_BYTES = 8 << 20


class Marker:
    """Unpickled, it runs ``touch PATH``: the proof that code from the network ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def listening_ports(pids) -> set[int]:
    """The TCP ports the processes ``pids`` listen on (what ``ss -ltnp`` shows of them)."""
    pids = set(pids)
    return {c.laddr.port for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.pid in pids}


def tree_pids(pid: int) -> set[int]:
    """``pid`` and its descendants still alive."""
    try:
        root = psutil.Process(pid)
        return {pid, *(p.pid for p in root.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def send_raw(port: int, marker, host: str = "127.0.0.1") -> None:
    """Garbage, a pickle, and an oversized frame, each on its own connection; whatever the port answers."""
    frames = [b"\x00\xff\x13garbage\r\n\r\n", pickle.dumps(Marker(marker)) + b"\n",
              pickle.dumps(Marker(marker)), b"\xff" * 16 + b"x" * OVERSIZED_BYTES]
    for frame in frames:
        try:
            with socket.create_connection((host, port), timeout=5) as conn:
                conn.sendall(frame)
                conn.settimeout(0.5)
                try:
                    conn.recv(4096)
                except OSError:
                    pass
        except OSError:
            pass


def attack_store(port: int, marker, queue_key: str, host: str = "127.0.0.1") -> bool:
    """As a client of a c10d store on ``port``: pickles pushed on ``queue_key`` (where a Ray job's driver
    reads its workers' reports) and real reports replayed; False if ``port`` is no store."""
    import torch.distributed as dist

    try:
        store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=5))
        store.check(["probe"])
    except Exception:  # noqa: BLE001 - not a store (another service's port)
        return False
    store.queue_push(queue_key, pickle.dumps(Marker(marker)))
    store.queue_push(queue_key, pickle.dumps((0, 0, Marker(marker))))
    store.queue_push(queue_key, b"\x00garbage")
    try:
        captured = store.queue_pop(queue_key, block=False)  # a real report, sent back twice
    except Exception:  # noqa: BLE001 - the queue was empty at that moment
        captured = None
    for _ in range(2 if captured is not None else 0):
        store.queue_push(queue_key, captured)
    return True


def store_values(port: int, host: str = "127.0.0.1", limit: int = 10000, timeout_s: float = 2.0) -> dict[str, bytes]:
    """Every key of the c10d store on ``port`` and its value, as anyone who reaches the port can read
    them (torch's store has no authentication); {} if ``port`` is no store."""
    import torch.distributed as dist

    try:
        store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
        keys = store.list_keys()[:limit]
        return dict(zip(keys, store.multi_get(keys))) if keys else {}
    except Exception:  # noqa: BLE001 - not a store, or it went away
        return {}


def attack_lines(port: int, marker, guesses=(), host: str = "127.0.0.1", timeout_s: float = 10.0) -> list:
    """As a client of a line-of-JSON service (the Group Generator): a hello with a made-up secret (no reply:
    no such service, and nothing more is sent), then one with each of ``guesses`` (say, every value read
    from the job's store), each followed by a request; requests without any hello; a pickle as a line.
    Return the reply to each hello (None: no reply)."""
    replies = []
    for secret in ["0" * 64, *guesses]:
        replies.append(_exchange(port, host, [{"op": "hello", "secret": secret}, {"op": "stats", "worker": 0}],
                                 timeout_s))
        if replies[0] is None:
            return replies
    _exchange(port, host, [{"op": "request", "worker": 1}, {"op": "leave", "worker": 0}], timeout_s)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(pickle.dumps(Marker(marker)).replace(b"\n", b" ") + b"\n")
    except OSError:
        pass
    return replies


def _exchange(port: int, host: str, lines: list[dict], timeout_s: float):
    """The first reply to ``lines`` sent one at a time on one connection (None: none came)."""
    first = None
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn, conn.makefile("rwb") as stream:
            for index, line in enumerate(lines):
                stream.write(json.dumps(line).encode() + b"\n")
                stream.flush()
                reply = json.loads(stream.readline() or b"null")
                first = reply if index == 0 else first
    except (OSError, ValueError):
        pass
    return first
