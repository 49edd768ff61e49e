"""Where the Group Generator listens: loopback for one machine, all interfaces for a multi-machine job."""

import ipaddress
import json
import socket

import pytest

from hetrain.prague.gg_service import GGServer, gg_bind_address
from hetrain.prague.group_generator import GroupGenerator


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
def test_a_multi_machine_job_binds_all_interfaces_and_publishes_a_reachable_address():
    bind, published = gg_bind_address(True, {"MASTER_ADDR": "10.255.255.1"})
    assert bind == "0.0.0.0"
    assert not ipaddress.ip_address(socket.gethostbyname(published)).is_loopback


def test_the_environment_variable_wins():
    assert gg_bind_address(True, {"MASTER_ADDR": "10.1.2.3", "HETRAIN_GG_HOST": "127.0.0.1"})[0] == "127.0.0.1"
    bind, published = gg_bind_address(False, {"HETRAIN_GG_HOST": "0.0.0.0"})
    assert bind == "0.0.0.0" and published not in ("0.0.0.0", "")


def test_a_server_on_all_interfaces_answers_on_its_published_address(monkeypatch):
    monkeypatch.setenv("HETRAIN_GG_HOST", "0.0.0.0")
    server = GGServer(GroupGenerator(2, 2, "smart"))
    try:
        with socket.create_connection((server.host, server.port), timeout=10) as conn, conn.makefile("rwb") as f:
            f.write(json.dumps({"op": "status"}).encode() + b"\n")
            f.flush()
            assert json.loads(f.readline()) == {"left": [], "served": 0}
    finally:
        server.close()
