"""The control plane and the data plane: payloads in the order their headers give, whatever the tags.

The split layout is NCCL's (a group per direction, every payload under one tag, which NCCL ignores
anyway); here it runs over gloo, through the same code, beside the shared layout CPU jobs use.
"""

import pytest
import torch

from hetrain.errors import UsageError
from hetrain.jobs.local_job import run_local
from hetrain.transport.data_plane import LAYOUT_ENV, DataPlane, data_plane_layout
from hetrain.transport.job import JobView
from hetrain.transport.peer_channels import DELTA, STOP, TOKEN, UPDATE, PeerChannels

NUMEL = 50_000  # a 200 kB model: past gloo's and NCCL's small-message paths
DELTA_NBYTES = 777  # a compressed difference: another size, so a payload read into the wrong message fails
MESSAGES = 24


def _view(backend: str) -> JobView:
    return JobView(None, 0, 2, torch.device("cpu"), 60.0, None, backend=backend)


def test_layout_defaults_and_refusals(monkeypatch):
    monkeypatch.delenv(LAYOUT_ENV, raising=False)
    assert data_plane_layout(_view("gloo")) == "shared"  # CPU jobs: no connection beyond the control plane's
    assert data_plane_layout(_view("nccl")) == "shared"  # NCCL payloads are an opt-in: staged over gloo
    assert data_plane_layout(_view("gloo"), "split") == "split"
    assert data_plane_layout(_view("nccl"), "nccl") == "nccl"
    monkeypatch.setenv(LAYOUT_ENV, "split")
    assert data_plane_layout(_view("gloo")) == "split"
    monkeypatch.setenv(LAYOUT_ENV, "nccl")
    assert data_plane_layout(_view("nccl")) == "nccl"
    with pytest.raises(UsageError, match="HETRAIN_DATA_PLANE=nccl sends payloads over NCCL, but this job's "
                                         "backend is gloo: unset HETRAIN_DATA_PLANE, or run with --backend nccl"):
        data_plane_layout(_view("gloo"))
    with pytest.raises(UsageError, match="use one of shared, split, nccl"):
        data_plane_layout(_view("gloo"), "both")


def test_payloads_travel_on_the_gpu_only_with_the_nccl_layout(monkeypatch):
    """Every layout but nccl moves a GPU model's payloads through the host (pinned staging) over gloo;
    only nccl builds NCCL groups for them (``meta`` stands in for the GPU: no group is built here)."""
    monkeypatch.delenv(LAYOUT_ENV, raising=False)
    gpu = JobView(None, 0, 1, torch.device("meta"), 60.0, None, backend="nccl")
    route = lambda peer, incarnation: (None, peer)  # noqa: E731
    for layout, device, splits in (("shared", "cpu", False), ("split", "cpu", True), ("nccl", "meta", True)):
        plane = DataPlane(gpu, "peers", route, 5.0, layout=layout)
        assert (plane.device().type, plane.splits, plane.on_stream) == (device, splits, layout == "nccl")
    channels = PeerChannels(gpu, 4, torch.float32, lambda m: None, lambda p, t: None)
    assert channels.data.layout == "shared" and channels.staging is not None  # staged by default
    monkeypatch.setenv(LAYOUT_ENV, "nccl")
    assert PeerChannels(gpu, 4, torch.float32, lambda m: None, lambda p, t: None).staging is None


def _payload(src: int, k: int) -> torch.Tensor:
    return torch.full((NUMEL,), float(1000 * src + k))


def _delta(src: int, k: int) -> torch.Tensor:
    return torch.full((DELTA_NBYTES,), (7 * src + k) % 256, dtype=torch.uint8)


def _exchange_everything(ctx, layout: str):
    """Every worker sends every other one models, compressed differences and tokens at once, from the
    main thread, while its receiver threads post the receives: each message must arrive whole, in order."""
    job = JobView.of(None, torch.device("cpu"), 30.0, "data-plane-test")
    got: dict[tuple[str, int], list] = {}
    errors: list[str] = []

    def on_message(message):
        if message.kind == UPDATE:
            ok = torch.equal(message.payload, _payload(message.src, message.iteration))
        elif message.kind == DELTA:
            ok = torch.equal(message.payload, _delta(message.src, message.iteration))
        else:
            ok = message.payload is None
        got.setdefault((message.channel, message.src), []).append((message.kind, message.iteration, ok))

    channels = PeerChannels(job, NUMEL, torch.float32, on_message, lambda peer, text: errors.append(text),
                            delta_nbytes=DELTA_NBYTES, data_layout=layout)
    peers = [r for r in range(job.world_size) if r != ctx.rank]
    channels.handshake(peers, peers)
    channels.listen("update", peers)
    channels.listen("token", peers)
    for k in range(MESSAGES):
        if k % 3 == 2:
            channels.send("update", peers, DELTA, k, 1, _delta(ctx.rank, k))
        else:
            channels.send("update", peers, UPDATE, k, 1, _payload(ctx.rank, k))
        channels.send("token", peers, TOKEN, k, 1)
    channels.send("update", peers, STOP)
    channels.send("token", peers, STOP)
    channels.flush()
    channels.join()
    channels.close()
    return channels.data.layout, {key: value for key, value in got.items()}, errors


@pytest.mark.parametrize("layout", ["shared", "split"])
def test_every_payload_arrives_whole_and_in_order(processes, layout):
    for rank, (used, got, errors) in enumerate(run_local(_exchange_everything, 3, (layout,), timeout_s=30)):
        assert used == layout and errors == []
        for src in (r for r in range(3) if r != rank):
            kinds = [DELTA if k % 3 == 2 else UPDATE for k in range(MESSAGES)]
            assert got[("update", src)] == [(kind, k, True) for k, kind in enumerate(kinds)] + [(STOP, 0, True)]
            assert got[("token", src)] == [(TOKEN, k, True) for k in range(MESSAGES)] + [(STOP, 0, True)]


def test_a_payload_on_the_token_channel_is_refused():
    channels = PeerChannels(JobView(None, 0, 1, torch.device("cpu"), 5.0, None), 4, torch.float32,
                            lambda m: None, lambda p, t: None)
    with pytest.raises(ValueError, match="'update' channel only"):
        channels.send("token", [], TOKEN, 0, 1, torch.zeros(4))


def test_a_payload_off_the_wire_device_is_refused():
    """What reaches the backend is on the job's wire device (the host under gloo): a GPU tensor would be
    read as host memory by gloo's point-to-point (``meta`` stands in for it here)."""
    plane = DataPlane(_view("gloo"), "peers", lambda peer, incarnation: (None, peer), 5.0, layout="shared")
    for post in (plane.send, plane.recv):
        with pytest.raises(ValueError, match="on meta, but this job's gloo messages travel on cpu"):
            post(torch.empty(3, device="meta"), 1)
