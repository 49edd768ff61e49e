"""Where the Group Generator listens: loopback for one machine, all interfaces for a multi-machine job."""

import ipaddress
import json
import socket

import pytest

from hetrain.groups.gg_service import GGServer, gg_bind_address
from hetrain.protocols.group_generator import GroupGenerator


def _has_a_route() -> bool:
    """Whether this machine has a non-loopback route (else the multi-machine case cannot be shown)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.1", 9))
            return not ipaddress.ip_address(probe.getsockname()[0]).is_loopback
    except OSError:
        return False


def test_a_single_machine_job_stays_on_loopback():
    assert gg_bind_address(False, {"MASTER_ADDR": "10.1.2.3"}) == ("127.0.0.1", "127.0.0.1")
    assert gg_bind_address(True, {"MASTER_ADDR": "127.0.0.1"}) == ("127.0.0.1", "127.0.0.1")  # nodes on localhost
    assert gg_bind_address(True, {"MASTER_ADDR": "localhost"}) == ("127.0.0.1", "127.0.0.1")
    assert gg_bind_address(True, {}) == ("127.0.0.1", "127.0.0.1")  # no torchrun: nothing to reach


@pytest.mark.skipif(not _has_a_route(), reason="this machine has no network route besides loopback")
def test_a_multi_machine_job_binds_all_interfaces_and_publishes_a_reachable_address(loopback):
    bind, published = gg_bind_address(True, {"MASTER_ADDR": "10.255.255.1"})
    assert bind == "0.0.0.0"
    assert not ipaddress.ip_address(socket.gethostbyname(published)).is_loopback


def test_the_environment_variable_wins(loopback):
    assert gg_bind_address(True, {"MASTER_ADDR": "10.1.2.3", "HETRAIN_GG_HOST": "127.0.0.1"})[0] == "127.0.0.1"
    bind, published = gg_bind_address(False, {"HETRAIN_GG_HOST": "0.0.0.0"})
    assert bind == "0.0.0.0" and published not in ("0.0.0.0", "")


def test_a_server_on_all_interfaces_answers_on_its_published_address(loopback, monkeypatch):
    monkeypatch.setenv("HETRAIN_GG_HOST", "0.0.0.0")
    server = GGServer(GroupGenerator(2, 2, "smart"), secret="c0" * 32)
    try:
        with socket.create_connection((server.host, server.port), timeout=10) as conn, conn.makefile("rwb") as f:
            for message in ({"op": "hello", "secret": server.secret}, {"op": "status"}):
                f.write(json.dumps(message).encode() + b"\n")
                f.flush()
                reply = json.loads(f.readline())
            assert reply == {"left": [], "served": 0}
    finally:
        server.close()


# ----- only the job's workers may talk to the Group Generator -------------------------------------

def _exchange(port: int, *lines: bytes) -> list[dict]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, sock.makefile("rwb") as stream:
        replies = []
        for line in lines:
            stream.write(line + b"\n")
            stream.flush()
            reply = stream.readline()
            if not reply:
                break
            replies.append(json.loads(reply))
            if "error" in replies[-1]:
                assert stream.readline() == b""  # the server closed the connection after refusing
                break
        return replies


def test_the_gg_refuses_clients_without_the_jobs_secret_and_malformed_lines_and_keeps_serving(loopback):
    import torch.distributed as dist

    from hetrain.groups.gg_service import SocketClient

    server = GGServer(GroupGenerator(4, 2, "random"), host="127.0.0.1")
    store = dist.HashStore()
    server.publish(store)
    try:
        request = json.dumps({"op": "request", "worker": 1}).encode()
        assert "error" in _exchange(server.port, request)[0]  # no hello: refused, connection closed
        wrong = json.dumps({"op": "hello", "secret": "guess"}).encode()
        assert len(refused := _exchange(server.port, wrong, request)) == 1 and "error" in refused[0]
        hello = json.dumps({"op": "hello", "secret": server.secret}).encode()
        replies = _exchange(server.port, hello, b"{not json", request)
        assert replies[0] == {"ok": True} and "error" in replies[1] and len(replies) == 2  # closed after it
        assert server.rejected == 3
        client = SocketClient(2, store, timeout_s=5)  # a real worker still gets its groups
        groups = client.request()
        assert groups and 2 in groups[0].members
        client.close()
    finally:
        server.close()
