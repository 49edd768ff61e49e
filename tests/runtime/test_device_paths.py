"""The device is a parameter everywhere: checked on the CPU through the code paths a GPU run takes.

PyTorch's ``meta`` device computes shapes, not values, and refuses a tensor from another device,
so a model on ``meta`` fed a host batch fails as a GPU model fed one does (the calibration of
every ``--device cuda`` run did that before this test existed).
"""

import time

import pytest
import torch

from hetrain.config import RunConfig
from hetrain.data import build_model, load_dataset, make_sampler
from hetrain.jobs.train_worker import measure_math_s
from hetrain.protocols.options import OptionError
from hetrain.transport.job import JobView


def test_the_calibration_feeds_the_model_batches_on_its_device():
    data = load_dataset("mlp", 0)
    sampler = make_sampler("mlp", data, 0, 1, 32, 0)
    model = build_model("mlp", 0, 0).to("meta")
    with pytest.raises(RuntimeError):  # what a GPU model fed host batches does
        model(sampler.next()[0])
    assert measure_math_s(model, sampler, torch.device("meta"), iterations=2) >= 0.0


def test_messages_travel_on_the_backends_device():
    gpu = torch.device("cuda", 1)
    view = lambda backend: JobView(None, 0, 2, gpu, 60.0, None, backend=backend)  # noqa: E731
    assert view("nccl").wire_device == gpu and view("nccl").nccl
    assert view("gloo").wire_device == torch.device("cpu") and not view("gloo").nccl  # through the host
    assert JobView(None, 0, 1, torch.device("cpu"), 60.0, None).wire_device == torch.device("cpu")


@pytest.mark.parametrize("fields, message", [
    (dict(protocol="hop", device="cuda", on_failure="respawn"), "watchdog tears down"),
    (dict(protocol="prague", device="cuda", on_failure="continue"), "watchdog tears down"),
    (dict(protocol="prague", device="cpu", backend="nccl"), "runs on GPUs"),
    (dict(protocol="prague", backend="mpi"), "must be nccl or gloo"),
])
def test_what_nccl_cannot_do_is_refused_naming_the_way_out(fields, message):
    with pytest.raises(OptionError) as info:
        RunConfig(iterations=3, num_workers=2, **fields).validate()
    assert message in info.value.template


def test_nccl_jobs_abort_on_a_death_unless_told_gloo():
    assert RunConfig(protocol="prague", device="cuda", iterations=3).resolved_on_failure() == "abort"
    assert RunConfig(protocol="prague", device="cuda", backend="gloo", iterations=3).resolved_on_failure() == "continue"
    assert RunConfig(protocol="hop", device="cuda", backend="gloo", num_workers=4, iterations=3).validate()
    assert RunConfig(protocol="hop", device="cuda", num_workers=1, iterations=3).validate()  # one rank: no messages
    for protocol in ("hop", "dpsgd"):  # payloads staged through the host over gloo unless HETRAIN_DATA_PLANE=nccl
        config = RunConfig(protocol=protocol, device="cuda", num_workers=4, iterations=3).validate()
        assert config.resolved_backend() == "nccl" and config.resolved_on_failure() == "abort"


def test_ddp_hook_timing_on_a_gpu_reads_events_not_the_host_clock(monkeypatch):
    """NCCL's future runs the hook's callback at enqueue: the host clock there stamps the launch. On a GPU
    the wait is the events' elapsed time (the stand-in's GPU clock runs 250 ms between the two)."""
    from hetrain.compression.spec import CompressionSpec
    from hetrain.runtime.allreduce import _HookTimer
    from hetrain.testing.fake_cuda import FakeCuda

    cuda = FakeCuda().install(monkeypatch)
    timer = _HookTimer(None, None, 2, CompressionSpec.parse("none"), torch.device("cuda", 0))
    timer.launched()
    cuda.now_ms += 250.0
    timer.done()
    assert timer.take_iteration_wait() == pytest.approx(0.25)
    assert ("event-synchronize", "default") in cuda.log  # each event waited for; never the device
    assert timer.take_iteration_wait() == 0.0  # nothing launched since
    host = _HookTimer(None, None, 2, CompressionSpec.parse("none"), torch.device("cpu"))
    began = time.perf_counter()
    host.launched()
    host.done()
    elapsed = time.perf_counter() - began
    assert 0.0 <= host.take_iteration_wait() <= elapsed  # the host clock between the two calls
