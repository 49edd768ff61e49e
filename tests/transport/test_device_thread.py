"""Helper threads wait on streams of their own; nothing waits on the compute stream or the whole device.

Checked as calls on a stand-in for ``torch.cuda`` (tests/transport/fake_cuda.py): which stream waits
for what, and in which order. ``scripts/gpu-check`` checks the same on a GPU.
"""

import datetime
import re
import threading
from pathlib import Path

import pytest
import torch

import hetrain
from hetrain.testing.fake_cuda import FakeCuda
from hetrain.transport.device_thread import StreamWork, device_thread, synchronize, wait_work

GPU = torch.device("cuda", 0)


def test_a_helper_thread_runs_on_a_stream_of_its_own_after_the_fork(monkeypatch):
    cuda = FakeCuda().install(monkeypatch)
    seen = {}

    def target(value):
        seen["stream"], seen["value"] = torch.cuda.current_stream().name, value
        cuda.log.append(("target",))

    device_thread(target, name="helper", device=GPU, args=(7,)).join(5)
    assert seen == {"stream": "own-helper", "value": 7}
    assert cuda.log == [("record", "default"),  # the fork, on the caller's (compute) stream
                        ("set_device", "cuda:0"),
                        ("wait_event", "own-helper", "default"),  # its own stream starts after the caller's work
                        ("target",),
                        ("synchronize", "own-helper")]  # done once joined: its own stream only


def test_a_helper_thread_synchronizes_its_stream_even_when_its_target_raises(monkeypatch):
    cuda = FakeCuda().install(monkeypatch)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)

    def fail():
        raise RuntimeError("lost")

    device_thread(fail, name="helper", device=GPU).join(5)
    assert cuda.log[-1] == ("synchronize", "own-helper")


def test_a_cpu_helper_thread_is_a_plain_thread(monkeypatch):
    cuda = FakeCuda().install(monkeypatch)
    got = []
    device_thread(got.append, name="helper", device=torch.device("cpu"), args=(1,)).join(5)
    device_thread(got.append, name="helper", device=None, args=(2,)).join(5)
    assert got == [1, 2] and cuda.log == []


def test_step_timing_waits_for_the_current_stream_not_the_device(monkeypatch):
    cuda = FakeCuda().install(monkeypatch)  # its torch.cuda.synchronize raises
    synchronize(GPU)
    synchronize(torch.device("cpu"))
    assert cuda.log == [("synchronize", "default")]


class _Work:
    """A work that completes after ``polls`` calls of is_completed(); ``wait`` records its arguments."""

    def __init__(self, polls: int):
        self.polls, self.waits = polls, []

    def is_completed(self) -> bool:
        self.polls -= 1
        return self.polls < 0

    def wait(self, *args):
        self.waits.append(args)
        return True


def test_a_streams_work_is_polled_then_waited_for_without_a_timeout():
    work = _Work(polls=3)
    wait_work(work, datetime.timedelta(seconds=5), True, "a payload")
    assert work.polls < 0 and work.waits == [()]  # never wait(timeout): that blocks inside NCCL
    StreamWork(work).wait(5.0)
    assert work.waits == [(), ()]


def test_a_gloo_works_wait_keeps_its_timeout():
    work = _Work(polls=0)
    wait_work(work, 2.5, False)
    assert work.waits == [(datetime.timedelta(seconds=2.5),)]


def test_a_streams_work_that_never_completes_times_out_naming_it():
    work = _Work(polls=10**9)
    with pytest.raises(RuntimeError, match="timed out after 0 s waiting for the model of iteration 4"):
        wait_work(work, 0.05, True, "the model of iteration 4")
    assert work.waits == []


def test_no_device_wide_synchronize_in_hetrain():
    """``torch.cuda.synchronize`` waits for every stream (NCCL's, helpers'): the step timers use the current
    stream (:func:`hetrain.transport.device_thread.synchronize`)."""
    package = Path(hetrain.__file__).parent
    offending = [str(path.relative_to(package)) for path in package.rglob("*.py")
                 if re.search(r"torch\.cuda\.synchronize\(", path.read_text())]
    assert offending == []
