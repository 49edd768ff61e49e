"""A stand-in for ``torch.cuda``'s streams and events that logs what the code under test asks of them (tests).

The GPU path's promises are about *which* stream waits for what (a helper thread's own stream, never the
compute stream or the device): on a machine without CUDA they are checked as calls, in order.
"""

from __future__ import annotations

import threading

import torch


class FakeCuda:
    def __init__(self):
        self.log: list[tuple] = []
        self.now_ms = 0.0  # the GPU's clock as events read it (a test advances it)
        self._local = threading.local()
        self.default = FakeStream(self, "default")

    def current(self) -> FakeStream:
        return getattr(self._local, "stream", self.default)

    def install(self, monkeypatch) -> FakeCuda:
        cuda = self

        class Event:
            def __init__(self, enable_timing: bool = False):
                self.stream = None

            def record(self, stream=None):
                self.stream = stream or cuda.current()
                self.ms = cuda.now_ms
                cuda.log.append(("record", self.stream.name))

            def elapsed_time(self, end) -> float:
                return end.ms - self.ms

            def synchronize(self):
                cuda.log.append(("event-synchronize", self.stream.name))

        class Stream:
            def __new__(cls, device=None):
                return FakeStream(cuda, f"own-{threading.current_thread().name}")

        class StreamContext:
            def __init__(self, stream):
                self.stream = stream

            def __enter__(self):
                self.previous = cuda.current()
                cuda._local.stream = self.stream

            def __exit__(self, *exc):
                cuda._local.stream = self.previous

        def device_wide(*args, **kwargs):
            raise AssertionError("torch.cuda.synchronize waits for every stream of the device")

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "stream", StreamContext)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: cuda.current())
        monkeypatch.setattr(torch.cuda, "set_device", lambda device: cuda.log.append(("set_device", str(device))))
        monkeypatch.setattr(torch.cuda, "synchronize", device_wide)
        return self


class FakeStream:
    def __init__(self, cuda: FakeCuda, name: str):
        self.cuda = cuda
        self.name = name
        self.device = torch.device("cuda", 0)

    def wait_event(self, event) -> None:
        self.cuda.log.append(("wait_event", self.name, event.stream.name))

    def wait_stream(self, other) -> None:
        self.cuda.log.append(("wait_stream", self.name, other.name))

    def synchronize(self) -> None:
        self.cuda.log.append(("synchronize", self.name))
