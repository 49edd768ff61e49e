"""The GPU path under pytest, where a GPU is; skipped on machines without CUDA.

``scripts/gpu-check`` is the check to run (hetrain/testing/gpu_check.py): it reports what it could
not run as "not checked" and fails then, where pytest counts a skip as a pass. One GPU is enough for
everything here but the two-rank NCCL tests: NCCL refuses two ranks on one GPU, so a single-GPU
machine checks NCCL with one rank and several ranks with gloo, which moves the GPU model's messages
through pinned host buffers.
"""

import json
import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

PROTOCOLS = ["allreduce", "dpsgd", "hop", "prague", "adpsgd", "ps"]


def _train(tmp_path, *args):
    from hetrain.cli import main

    out = tmp_path / "run"
    assert main(["train", "--device", "cuda", "--iterations", "40", "--no-progress", "--out", str(out), *args]) == 0
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_one_nccl_rank_per_gpu_trains(tmp_path, protocol):
    workers = torch.cuda.device_count()
    groups = ["--group-size", str(min(2, workers))] if protocol == "prague" else []  # one GPU: groups of one
    metrics = _train(tmp_path, "--protocol", protocol, "--workers", str(workers), *groups)
    assert metrics["final_accuracy_avg_model"] > 0.5


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_four_gloo_ranks_share_one_gpu(tmp_path, protocol):
    metrics = _train(tmp_path, "--protocol", protocol, "--workers", "4", "--backend", "gloo")
    assert metrics["final_accuracy_avg_model"] > 0.5 and metrics["num_workers"] == 4


def _preduce_on_gpu(ctx, compression):
    from hetrain.compression.codecs import make_codec
    from hetrain.groups.preduce import PReduce

    codec = make_codec(compression, 1000) if compression != "none" else None
    preduce = PReduce(cache_size=4, timeout_s=30, codec=codec)
    buf = torch.full((1000,), float(ctx.rank), device=ctx.device)
    for _ in range(3):
        preduce(buf, members=range(ctx.world_size))
    return buf.device.type, float(buf.mean())


@pytest.mark.parametrize("compression", ["none", "int8"])
def test_preduce_averages_gpu_tensors_over_gloo(compression):
    from hetrain.jobs.local_job import run_local

    for device, mean in run_local(_preduce_on_gpu, 4, (compression,), device="cuda", timeout_s=60):
        assert device == "cuda" and mean == pytest.approx(1.5, abs=1e-3)


def _hop_on_gpu(ctx, compression, layout=None):
    import hetrain

    if layout is not None:  # set in the worker: a running forkserver would not pass a later environment on
        os.environ["HETRAIN_DATA_PLANE"] = layout

    model = torch.nn.Linear(8, 8, bias=False).to(ctx.device)
    with torch.no_grad():
        model.weight.fill_(float(ctx.rank))
    sync = hetrain.Hop(model, backup=0, staleness=0, skip_threshold=0, max_ig=4, compression=compression)
    for _ in range(40):
        sync.step()
    spread = float(model.weight.mean())
    sync.finish()
    return model.weight.device.type, spread, float(model.weight.mean())


@pytest.mark.parametrize("compression", ["none", "int8"])
def test_hop_channels_carry_gpu_models_over_gloo(compression):
    from hetrain.jobs.local_job import run_local

    results = run_local(_hop_on_gpu, 4, (compression,), device="cuda", timeout_s=60)
    assert all(device == "cuda" for device, _, _ in results)
    assert max(m for _, m, _ in results) - min(m for _, m, _ in results) < 0.1
    assert all(final == pytest.approx(1.5, abs=1e-3) for _, _, final in results)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank")
def test_preduce_over_nccl_on_two_gpus():
    from hetrain.jobs.local_job import run_local

    for device, mean in run_local(_preduce_on_gpu, 2, ("none",), backend="nccl", device="cuda", timeout_s=60):
        assert device == "cuda" and mean == pytest.approx(0.5)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank")
@pytest.mark.parametrize("compression", ["none", "int8"])
def test_hop_payloads_over_nccl_on_two_gpus(compression):
    """Headers over gloo, payloads over NCCL (the opt-in nccl data plane: one group per direction)."""
    from hetrain.jobs.local_job import run_local

    results = run_local(_hop_on_gpu, 2, (compression, "nccl"), backend="nccl", device="cuda", timeout_s=60)
    assert all(device == "cuda" for device, _, _ in results)
    assert all(final == pytest.approx(0.5, abs=1e-3) for _, _, final in results)
