"""Joining the Ray cluster from the driver, and what the driver's actors are told of it.

Ray is imported here, on use (``hetrain[ray]`` is an extra). On a cluster whose address is on
loopback (one machine, as in the tests), the driver registers as 127.0.0.1, its store and Group
Generator bind 127.0.0.1 and the actors' gloo uses the loopback interface (``GLOO_SOCKET_IFNAME=lo``,
unless set): nothing listens beyond the machine. On a real cluster the driver binds the address Ray
knows its node by, which the other nodes reach.
"""

from __future__ import annotations

import ipaddress
import os
import socket

from hetrain.errors import UsageError

FORWARDED_PREFIXES = ("HETRAIN_", "GLOO_", "TORCH_GLOO_", "NCCL_", "OMP_NUM_THREADS")


def require_ray():
    """The ``ray`` module, or UsageError naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise UsageError("--launcher ray (hetrain.ray) needs Ray: pip install 'hetrain[ray]'") from None
    return ray


def connect(address: str | None) -> tuple[str, bool]:
    """Join the cluster at ``address`` unless this process has joined one; return (the address the
    driver's services bind, whether this call joined: the caller leaves it then)."""
    ray = require_ray()
    joined = False
    if not ray.is_initialized():
        host = _host_of(address)
        options = {"_node_ip_address": "127.0.0.1"} if host is not None and is_loopback(host) else {}
        try:
            ray.init(address=address, **options)
        except (ConnectionError, ValueError) as error:
            raise UsageError(f"--ray-address {address}: cannot join the Ray cluster: {error}") from None
        joined = True
    return ray.util.get_node_ip_address(), joined


def actor_env(host: str) -> dict:
    """The environment the driver hands its actors: hetrain's, gloo's and NCCL's settings from its own,
    and gloo on the loopback interface when the driver's address is a loopback one."""
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}
    if is_loopback(host):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _host_of(address: str | None) -> str | None:
    """The host of a Ray address (``HOST:PORT``, ``ray://HOST:PORT``); None for ``auto``, ``local`` or none."""
    if not address or address in ("auto", "local"):
        return None
    return address.split("://", 1)[-1].rsplit(":", 1)[0] or None
