"""Pinned host staging: pooled buffers reused once free, held by a send until it is reaped, and the GPU's
copies ordered after the compute stream (checked as calls on a stand-in for ``torch.cuda``)."""

import threading

import torch

from hetrain.testing.fake_cuda import FakeCuda
from hetrain.transport.send_window import SendWindow
from hetrain.transport.staging import HostStaging

NUMEL = 1000


def test_an_outgoing_copy_is_exact_and_its_buffer_comes_back_once_dropped():
    staging = HostStaging(torch.device("cpu"))
    payload = torch.randn(NUMEL)
    first = staging.outgoing(payload)
    assert torch.equal(first, payload) and first.data_ptr() != payload.data_ptr()
    held = first.data_ptr()
    second = staging.outgoing(payload)  # the first is still held: another buffer
    assert second.data_ptr() != held
    del first
    third = staging.outgoing(payload * 2)
    assert third.data_ptr() == held and torch.equal(third, payload * 2)
    pool = staging.pool(NUMEL, torch.float32)
    assert (pool.allocated, pool.reused, staging.kept) == (2, 1, 2)


class _BlockedWork:
    def __init__(self):
        self.released = threading.Event()

    def wait(self, timeout=None):
        assert self.released.wait(10)
        return True


def test_a_send_window_holds_the_staged_buffer_until_the_send_is_reaped():
    staging = HostStaging(torch.device("cpu"))
    window = SendWindow("worker 0", 1, timeout_s=10)
    work = _BlockedWork()
    host = staging.outgoing(torch.ones(NUMEL))
    staged_at = host.data_ptr()
    window.post(lambda: [work], host)
    del host
    busy = staging.outgoing(torch.zeros(NUMEL))  # gloo may still read the first: not reused
    assert busy.data_ptr() != staged_at
    del busy
    work.released.set()
    window.drain(5)
    window.close()
    reused = {staging.outgoing(torch.zeros(NUMEL)).data_ptr() for _ in range(2)}
    assert staged_at in reused


def test_incoming_copies_into_the_device_buffer_and_frees_the_host_buffer():
    staging = HostStaging(torch.device("cpu"))
    host = staging.receive_buffer(NUMEL, torch.float32)
    host.copy_(torch.arange(NUMEL, dtype=torch.float32))
    landed = staging.incoming(host, lambda: torch.empty(NUMEL))
    assert torch.equal(landed, torch.arange(NUMEL, dtype=torch.float32))
    at = host.data_ptr()
    del host
    assert staging.receive_buffer(NUMEL, torch.float32).data_ptr() == at
    delta = staging.receive_buffer(77, torch.uint8).fill_(5)  # a compressed difference: a pool of its own
    assert torch.equal(staging.incoming(delta), torch.full((77,), 5, dtype=torch.uint8))


class _Target:
    def __init__(self, cuda):
        self.cuda = cuda

    def copy_(self, source, non_blocking=False):
        self.cuda.log.append(("copy", torch.cuda.current_stream().name))
        return self


def test_on_a_gpu_the_receivers_copy_follows_the_compute_stream_and_is_waited_for_on_its_own(monkeypatch):
    cuda = FakeCuda().install(monkeypatch)
    staging = HostStaging(torch.device("cuda", 0))  # built on the main thread: its stream is the compute stream
    receiver = torch.cuda.Stream()
    with torch.cuda.stream(receiver):
        staging.incoming(torch.zeros(4), lambda: _Target(cuda))
    name = receiver.name
    assert cuda.log == [("wait_stream", name, "default"), ("copy", name), ("synchronize", name)]


def test_on_a_gpu_a_send_waits_for_its_copy_only(monkeypatch):
    cuda = FakeCuda().install(monkeypatch)  # torch.cuda.synchronize raises
    staging = HostStaging(torch.device("cuda", 0))
    assert torch.equal(staging.outgoing(torch.ones(3)), torch.ones(3))  # (the copy itself runs on the host here)
    assert cuda.log == [("record", "default"), ("event-synchronize", "default")]
