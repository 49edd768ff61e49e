"""A job's secret: how hetrain's own channels and services tell the job's processes from strangers.

Each job has one random secret, handed to its processes only by ways a stranger on the network cannot
read: a local job's workers are forked with it, a Ray job's actors get it as an argument of their
Ray call, and the ranks of a torchrun job take it from ``$HETRAIN_JOB_SECRET`` (or, on one machine,
from a file only the job's user can read: :mod:`hetrain.groups.gg_secret`). It never travels through
a store or a socket. What a process writes where a stranger can reach it is sealed (:func:`seal`: an
HMAC-SHA256 of the key it is written under and the bytes), and the reader keeps only what unseals
(:func:`unseal`); the Group Generator asks for it in a connection's first line. See
docs/guides/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from hetrain.errors import UsageError

SECRET_ENV = "HETRAIN_JOB_SECRET"
MIN_SECRET_CHARS = 16
MAC_CHARS = 64  # hex of SHA-256


def new_secret() -> str:
    """A fresh secret (256 random bits, hex)."""
    return secrets.token_hex(32)


def env_secret(env=None) -> str | None:
    """``$HETRAIN_JOB_SECRET`` (None when unset); UsageError when it is too short to be a secret."""
    env = os.environ if env is None else env
    value = env.get(SECRET_ENV)
    if value is None:
        return None
    if len(value) < MIN_SECRET_CHARS:
        raise UsageError(f"{SECRET_ENV} has {len(value)} characters; give at least {MIN_SECRET_CHARS} random ones, "
                         f"the same on every node (e.g. {SECRET_ENV}=$(python -c 'import secrets; "
                         "print(secrets.token_hex(32))'))")
    return value


def seal(secret: str, key: str, body: bytes) -> bytes:
    """``body`` with its MAC in front, bound to ``key`` (the name it is written under)."""
    return mac(secret, key, body) + b"." + body


def unseal(secret: str, key: str, data: bytes) -> bytes | None:
    """The body of ``data`` if ``data`` was sealed with ``secret`` under ``key``; None for anything else."""
    tag, dot, body = bytes(data).partition(b".")
    if not dot or len(tag) != MAC_CHARS or not hmac.compare_digest(tag, mac(secret, key, body)):
        return None
    return body


def mac(secret: str, key: str, body: bytes) -> bytes:
    return hmac.new(secret.encode(), key.encode() + b"\0" + body, hashlib.sha256).hexdigest().encode()


def same_secret(given, secret: str) -> bool:
    """Whether ``given`` (a peer's claim, of any type) is ``secret``, in constant time."""
    return isinstance(given, str) and hmac.compare_digest(given.encode(), secret.encode())
