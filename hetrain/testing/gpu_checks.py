"""The bodies of ``scripts/gpu-check``'s checks (:mod:`hetrain.testing.gpu_check` runs each in a process).

Each takes the output folder and returns a one-line summary; it raises :class:`NotChecked` when it
cannot run here and anything else (an AssertionError naming what differed) when it fails.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import torch

NUMEL_64MB = 16 * 2**20  # float32: 64 MiB per payload
MESSAGES = 3
BIG = ["--workload", "synthetic", "--model-params", "1000000"]  # a 4 MB model: 8 MB of copies per pair
PROTOCOLS = ("allreduce", "dpsgd", "hop", "prague", "adpsgd", "ps")
STEP_LIMIT_S = 0.25  # a timer that waited for a 1 s kernel on another stream would read about 1 s


class NotChecked(Exception):
    """This check cannot run here (the message says why)."""


def _need_gpus(count: int) -> None:
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < count:
        raise NotChecked("no CUDA device" if have == 0 else f"needs {count} GPUs, this machine has {have}")


def _train(out: Path, name: str, *args: str, env: dict | None = None) -> dict:
    from hetrain.cli import main

    saved = {key: os.environ.get(key) for key in (env or {})}
    os.environ.update(env or {})
    try:
        code = main(["train", "--no-progress", "--out", str(out / name), *args])
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    assert code == 0, f"hetrain train {' '.join(args)} exited {code} (see {out / name})"
    return json.loads((out / name / "metrics.json").read_text())


# ----- one GPU ---------------------------------------------------------------------------------
def environment(out: Path) -> str:
    _need_gpus(1)
    return (f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): "
            f"{torch.cuda.get_device_name(0)}")


def _payload(src: int, k: int, device) -> torch.Tensor:
    generator = torch.Generator(device=device).manual_seed(1000 * src + k)
    return torch.randn(NUMEL_64MB, generator=generator, device=device)


def _staged_transfer_worker(ctx) -> dict:
    from hetrain.transport.device_thread import synchronize
    from hetrain.transport.job import JobView
    from hetrain.transport.peer_channels import STOP, UPDATE, PeerChannels

    job = JobView.of(None, ctx.device, 120.0, "gpu-check-staging")
    got, errors = [], []
    channels = PeerChannels(job, NUMEL_64MB, torch.float32, got.append, lambda peer, text: errors.append(text))
    peer = 1 - ctx.rank
    channels.handshake([peer], [peer])
    channels.listen("update", [peer])
    a = torch.randn(4096, 4096, device=ctx.device)
    expected = a @ a
    synchronize(ctx.device)
    began = time.perf_counter()
    for k in range(MESSAGES):
        for _ in range(8):  # compute on the default stream while the payloads travel
            product = a @ a
        channels.send("update", [peer], UPDATE, k, 1, _payload(ctx.rank, k, ctx.device))
    channels.send("update", [peer], STOP)
    channels.flush()
    channels.join()
    seconds = time.perf_counter() - began
    synchronize(ctx.device)
    models = [m for m in got if m.kind == UPDATE]
    pool = channels.staging.pool(NUMEL_64MB, torch.float32) if channels.staging is not None else None
    result = {
        "layout": channels.data.layout, "staged": channels.staging is not None, "errors": errors,
        "received": [m.iteration for m in models],
        "exact": all(m.payload.is_cuda and torch.equal(m.payload, _payload(peer, m.iteration, ctx.device))
                     for m in models),
        "matmul_ok": bool(torch.allclose(product, expected)),
        "pinned": bool(pool is not None and pool.pin_memory), "seconds": seconds,
    }
    channels.close()
    return result


def staged_transfer_64mb(out: Path) -> str:
    _need_gpus(1)
    from hetrain.jobs.local_job import run_local

    results = run_local(_staged_transfer_worker, 2, backend="gloo", device="cuda", timeout_s=120, stoppable=False)
    for rank, r in enumerate(results):
        assert r["layout"] == "shared" and r["staged"] and r["pinned"], f"worker {rank}: not staged: {r}"
        assert r["errors"] == [], f"worker {rank}: {r['errors']}"
        assert r["received"] == list(range(MESSAGES)), f"worker {rank} received {r['received']}"
        assert r["exact"], f"worker {rank}: a payload differs from what was sent"
        assert r["matmul_ok"], f"worker {rank}: the matmuls beside the transfer computed something else"
    mb_s = 2 * MESSAGES * 64 / max(r["seconds"] for r in results)
    return f"{2 * MESSAGES} x 64 MB exact, pinned, matmuls beside them correct; {mb_s:.0f} MB/s both ways"


def _cycles_per_s(device) -> float:
    """How many cycles ``torch.cuda._sleep`` spins per second on ``device``, timed with events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10**7)
    end.record()
    end.synchronize()
    return 10**7 / (start.elapsed_time(end) / 1000.0)


def timing_excludes_other_streams(out: Path) -> str:
    _need_gpus(1)
    import hetrain
    from hetrain.transport.device_thread import device_thread, synchronize

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    second = int(_cycles_per_s(device))
    # 1. a side stream busy for a second: the compute stream's synchronize does not wait for it
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        torch.cuda._sleep(second)
    began = time.perf_counter()
    synchronize(device)
    step_s = time.perf_counter() - began
    side.synchronize()
    side_s = time.perf_counter() - began
    assert side_s >= 0.7, f"the side stream's kernel took {side_s:.2f} s, not about 1 s: the check proves nothing"
    assert step_s < STEP_LIMIT_S, f"synchronize waited {step_s:.2f} s for another stream's kernel"
    # 2. a helper thread's kernels run on its own stream
    seen, queued = {}, threading.Event()

    def helper() -> None:
        seen["own"] = torch.cuda.current_stream(device) != torch.cuda.default_stream(device)
        torch.cuda._sleep(second)
        queued.set()

    began = time.perf_counter()
    thread = device_thread(helper, name="gpu-check-helper", device=device)
    assert queued.wait(10), "the helper thread did not queue its kernel within 10 s"
    synchronize(device)
    main_s = time.perf_counter() - began
    thread.join(10)
    assert seen.get("own"), "a helper thread ran on the default stream"
    assert main_s < STEP_LIMIT_S + 0.05, f"the compute stream waited {main_s:.2f} s for a helper's kernel"
    # 3. a protocol step's timing (compute and wait) leaves out a second of another stream's kernel
    model = torch.nn.Linear(256, 256).to(device)
    sync = hetrain.DPSGD(model, timeout_s=30)  # one worker alone: the step's own timing, nothing exchanged
    model(torch.randn(64, 256, device=device)).sum().backward()  # warm-up: cuBLAS's start-up is not the point
    synchronize(device)
    with torch.cuda.stream(side):
        torch.cuda._sleep(second)
    sync.restart_clock()
    model(torch.randn(64, 256, device=device)).sum().backward()
    sync.step()
    counted = sync.stats.compute_s + sync.stats.wait_s
    sync.finish()
    side.synchronize()
    assert counted < STEP_LIMIT_S, f"a step counted {counted:.2f} s: it waited for another stream's kernel"
    return (f"compute stream's synchronize {step_s * 1000:.0f} ms beside a {side_s:.1f} s side-stream kernel; "
            f"helper on its own stream; a step counted {counted * 1000:.0f} ms")


def protocols_4_gloo_ranks(out: Path) -> str:
    _need_gpus(1)
    scores, failed = [], []
    for protocol in PROTOCOLS:
        metrics = _train(out, f"train-{protocol}", "--device", "cuda", "--backend", "gloo", "--workers", "4",
                         "--iterations", "40", "--protocol", protocol)
        accuracy = metrics["final_accuracy_avg_model"]
        scores.append(f"{protocol} {accuracy:.2f}")
        if accuracy <= 0.5 or metrics["num_workers"] != 4:
            failed.append(protocol)
    assert not failed, f"accuracy 0.5 or less: {failed} ({', '.join(scores)})"
    return "accuracy of the averaged model: " + ", ".join(scores)


def comm_memory_budget(out: Path) -> str:
    _need_gpus(1)
    from hetrain.cli import main

    refused = main(["train", "--device", "cuda", "--backend", "gloo", "--protocol", "prague", "--compress", "int8",
                    *BIG, "--comm-memory-mb", "4", "--workers", "3", "--iterations", "3", "--no-progress",
                    "--out", str(out / "refused")])
    assert refused == 2, f"a 4 MB model in pairs under --comm-memory-mb 4 exited {refused}, not 2 (refused)"
    metrics = _train(out, "budget", "--device", "cuda", "--backend", "gloo", "--protocol", "prague", "--gg",
                     "random", "--compress", "int8", *BIG, "--comm-memory-mb", "12", "--workers", "3",
                     "--iterations", "30")
    workers = metrics["workers"]
    held = max(w["replica_bytes_peak"] for w in workers)
    assert all(w["comm_cache_entries"] == 1 for w in workers), [w["comm_cache_entries"] for w in workers]
    assert 0 < held <= 12 * 2**20, f"public copies held {held / 2**20:.1f} MB, budget 12 MB"
    gpu = max(w.get("gpu_peak_mb", 0.0) for w in workers)
    return (f"refused under 4 MB; under 12 MB: 1 set cached, copies {held / 2**20:.1f} MB at most (on the host: "
            f"gloo averages a host copy), GPU peak {gpu:.0f} MB per worker")


def compare_hop_allreduce_30s(out: Path) -> str:
    _need_gpus(1)
    from hetrain.cli import main

    target = out / "compare"
    code = main(["compare", "--protocols", "allreduce,hop", "--device", "cuda", "--backend", "gloo", "--workers",
                 "4", "--slowdown", "0:3x", "--time-budget", "30", "--no-progress", "--out", str(target)])
    assert code == 0, f"hetrain compare exited {code} (see {target})"
    return f"compared: {target / 'summary.md'}"


# ----- two GPUs (optional: "not checked" on one) -------------------------------------------------
def _preduce_worker(ctx) -> float:
    from hetrain.groups.preduce import PReduce

    preduce = PReduce(cache_size=4, timeout_s=60)
    buf = torch.full((1000,), float(ctx.rank), device=ctx.device)
    for _ in range(3):
        preduce(buf, members=range(ctx.world_size))
    return float(buf.mean())


def nccl_preduce_2gpus(out: Path) -> str:
    _need_gpus(2)
    from hetrain.jobs.local_job import run_local

    means = run_local(_preduce_worker, 2, backend="nccl", device="cuda", timeout_s=60, stoppable=False)
    assert all(abs(mean - 0.5) < 1e-6 for mean in means), means
    return "2 ranks averaged to 0.5"


def nccl_hop_payloads_2gpus(out: Path) -> str:
    _need_gpus(2)
    for compress in ("none", "int8"):
        metrics = _train(out, f"hop-nccl-{compress}", "--device", "cuda", "--protocol", "hop", "--workers", "2",
                         "--iterations", "40", "--compress", compress, env={"HETRAIN_DATA_PLANE": "nccl"})
        assert metrics["final_accuracy_avg_model"] > 0.5, f"{compress}: {metrics['final_accuracy_avg_model']}"
    return "hop with payloads over NCCL trained, with and without compression"


def nccl_comm_memory_2gpus(out: Path) -> str:
    _need_gpus(2)
    budget_mb = 200  # one set: 2 x 4 MB of copies and an NCCL communicator (128 MB, estimated)
    metrics = _train(out, "budget-nccl", "--device", "cuda", "--protocol", "prague", "--compress", "int8", *BIG,
                     "--comm-memory-mb", str(budget_mb), "--workers", "2", "--iterations", "30")
    workers = metrics["workers"]
    gpu = max(w["gpu_peak_mb"] for w in workers)
    assert all(w["comm_cache_entries"] == 1 for w in workers)
    assert gpu <= budget_mb, f"GPU peak {gpu:.0f} MB per worker, budget {budget_mb} MB"
    return f"GPU peak {gpu:.0f} MB per worker (budget {budget_mb} MB, NCCL's own buffers not counted by torch)"

