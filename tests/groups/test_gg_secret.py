"""The Group Generator's secret under torchrun (no hetrain launcher): never in the store; from
$HETRAIN_JOB_SECRET, or on one machine from a file only this user can read; refused beyond loopback
without one."""

import os
import stat

import pytest

from hetrain.errors import UsageError, WorkerError
from hetrain.groups import gg_secret
from hetrain.groups.gg_service import ADDRESS_KEY, GGServer, SocketClient
from hetrain.protocols.group_generator import GroupGenerator
from hetrain.transport.job_secret import SECRET_ENV


@pytest.fixture
def store():
    import torch.distributed as dist

    return dist.HashStore()


def _published(store) -> dict:
    keys = [ADDRESS_KEY, gg_secret.FILE_KEY]
    return {k: store.get(k).decode() for k in keys}


def test_on_one_machine_the_secret_goes_through_a_private_file_and_only_its_name_through_the_store(
        loopback, store, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    server = GGServer(GroupGenerator(4, 2, "random"), host="127.0.0.1")
    try:
        server.publish(store)
        assert server.secret not in _published(store).values()
        path = os.path.join(gg_secret.private_dir(), _published(store)[gg_secret.FILE_KEY])
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(gg_secret.private_dir()).st_mode) == 0o700
        client = SocketClient(1, store, timeout_s=10)  # another rank reads the file
        assert client.request() is not None
        client.close()
    finally:
        server.close()
    assert not os.path.exists(path)  # removed with the server


def test_the_environment_gives_the_secret_and_nothing_is_written(loopback, store, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "f0" * 32)
    server = GGServer(GroupGenerator(4, 2, "random"), host="127.0.0.1")
    try:
        server.publish(store)
        assert server.secret == "f0" * 32 and server.secret_file is None
        assert _published(store)[gg_secret.FILE_KEY] == ""
        client = SocketClient(3, store, timeout_s=10)
        client.close()
    finally:
        server.close()


def test_beyond_loopback_without_a_secret_is_refused_saying_how_to_give_one(loopback, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(UsageError, match=SECRET_ENV):
        GGServer(GroupGenerator(4, 2, "random"), host="0.0.0.0")
    monkeypatch.setenv(SECRET_ENV, "short")
    with pytest.raises(UsageError, match="at least"):
        GGServer(GroupGenerator(4, 2, "random"), host="0.0.0.0")


def test_a_rank_without_the_environments_secret_says_so(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(WorkerError, match=SECRET_ENV):
        gg_secret.worker_secret(2, "")
