"""The Ray job's c10d store: a ``TCPStore`` the driver hosts, on a port the OS picks, on one address.

torch's ``TCPStore`` server listens on every interface; given a socket already bound
(``master_listen_fd``), it listens on that one. The driver binds the address its actors reach it by
(its node's address in the Ray cluster; 127.0.0.1 on a cluster on loopback), port 0, so nothing is
fixed and nothing else is exposed. The workers rendezvous on it (the default process group and every
group the protocols build), and the launcher's channels live on it (:mod:`hetrain.ray.channels`).
"""

from __future__ import annotations

import datetime
import socket

import torch.distributed as dist


class DriverStore:
    def __init__(self, host: str, timeout_s: float):
        self.host = host
        self.timeout_s = timeout_s
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self._sock.listen(1024)
        self.port = self._sock.getsockname()[1]
        self.store = dist.TCPStore(host, self.port, is_master=True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=timeout_s),
                                   master_listen_fd=self._sock.fileno(), use_libuv=True)
        self._sock.detach()  # the store's server owns the descriptor now (closed with it: never twice)

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def close(self) -> None:
        """Let go of the store: its server stops once the last reference to it goes (the channels' too)."""
        self.store = None


def connect(host: str, port: int, timeout_s: float):
    """A client of the driver's store (a worker's)."""
    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
