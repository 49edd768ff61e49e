"""Send cost: the sender's time to post one Hop update (1 MB model) and one token, at the current code.

    .venv/bin/python benchmarks/send_cost_bench.py --out runs/send-cost/send_cost.json
    .venv/bin/python benchmarks/send_cost_bench.py --out /tmp/send_cost.json --sends 500   # quicker

Two processes over gloo on loopback (a FileStore in a temporary directory, no
port), each with the :class:`~hetrain.transport.peer_channels.PeerChannels`
Hop uses: worker 0 sends, worker 1 receives both channels (into fresh
tensors, PeerChannels' default). After a handshake and ``--warmup`` untimed iterations, each of
``--sends`` iterations times (``time.perf_counter``) exactly what Hop's
iteration pays to communicate on the sender's side::

    channels.send("update", [1], UPDATE, i, 0, payload)   # header + 1 MB payload, through the SendWindow
    channels.send("token", [1], TOKEN, i, 1)               # header only

with a distinct payload tensor per iteration (a copy made before the timer
starts, as Hop gathers its model into a buffer before sending it). The sends are asynchronous: the figure is the cost
of posting them (including any wait on a full window of 8 in flight), not the
time until the receiver has them. Prints median/min/max and p90 in ms and
writes them, with the per-iteration times, to ``--out`` (JSON).

Every wait is bounded: gloo's and the channels' by ``--timeout`` seconds, the
workers' results and exits by the same.

The comparison figure in the docs ("1.10 ms with the old ever-growing list of
sends") was measured at commit 439e10b (2026-11-30) with a ``/tmp`` script that
was never committed; the old list (``PeerChannels._pending``, scanned with
``is_completed()`` on every send) no longer exists, so this script measures
only the current send path.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ONE_MB_FLOATS = 262_144


def _worker(rank: int, store_path: str, sends: int, warmup: int, numel: int, timeout_s: float, results) -> None:
    try:
        import torch
        import torch.distributed as dist

        from hetrain.transport.job import JobView, prefer_lazy_connections
        from hetrain.transport.peer_channels import STOP, TOKEN, UPDATE, PeerChannels

        torch.set_num_threads(1)
        prefer_lazy_connections()  # as hetrain's workers connect
        store = dist.FileStore(store_path, 2)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=timeout_s))
        job = JobView.of(None, torch.device("cpu"), timeout_s, "send-cost")
        received = {"update": 0, "token": 0}
        errors: list[str] = []

        def on_message(message) -> None:
            if message.kind != STOP:
                received[message.channel] += 1

        channels = PeerChannels(job, numel, torch.float32, on_message,
                                lambda peer, text: errors.append(f"peer {peer}: {text}"))
        peer = 1 - rank
        channels.handshake([peer], [peer])
        if rank == 1:
            channels.listen("update", [0])
            channels.listen("token", [0])
            channels.join()  # each receiver thread ends on its STOP (bounded by the timeout)
            channels.close()
            results.put((rank, {"received": received, "errors": errors}))
            return
        total = warmup + sends
        source = torch.randn(numel)
        times_ms = []
        for i in range(total):
            payload = source.clone()  # a distinct 1 MB tensor per update, made before the timer starts
            began = time.perf_counter()
            channels.send("update", [1], UPDATE, i, 0, payload)
            channels.send("token", [1], TOKEN, i, 1)
            elapsed = time.perf_counter() - began
            if i >= warmup:
                times_ms.append(elapsed * 1000.0)
        channels.send("update", [1], STOP)
        channels.send("token", [1], STOP)
        channels.flush()
        max_seen = channels.max_in_flight_seen()
        channels.close()
        results.put((rank, {"times_ms": times_ms, "max_in_flight_seen": max_seen, "errors": errors}))
    except Exception as exc:  # reported to the parent, which names the worker
        results.put((rank, {"error": f"{type(exc).__name__}: {exc}"}))


def _commit() -> str:
    """``git rev-parse --short HEAD``, marked when hetrain/ has changes not committed; "unknown" outside git."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10, cwd=here).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "hetrain"], capture_output=True, text=True,
                               timeout=10, cwd=here.parent).stdout.strip()
    except Exception:
        return "unknown"
    return (head + ("+uncommitted hetrain/ changes" if dirty else "")) if head else "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/send-cost/send_cost.json")
    parser.add_argument("--sends", type=int, default=2000, help="timed iterations (one update + one token each)")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--numel", type=int, default=ONE_MB_FLOATS, help="float32 elements per update (1 MB)")
    parser.add_argument("--timeout", type=float, default=30.0, help="bound of every wait, seconds")
    parser.add_argument("--commit", help="the commit to record (default: git rev-parse --short HEAD), e.g. for "
                                         "a `git archive` export of a commit, which has no .git")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="hetrain-send-cost-") as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_worker, args=(rank, store_path, args.sends, args.warmup, args.numel,
                                                   args.timeout, results), daemon=True) for rank in (0, 1)]
        began = time.perf_counter()
        for proc in procs:
            proc.start()
        by_rank = {}
        deadline = time.monotonic() + 2 * args.timeout + 60.0  # start-up (imports) + the sends, bounded
        try:
            while len(by_rank) < 2:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                rank, record = results.get(timeout=left)
                if "error" in record:
                    print(f"send_cost_bench: worker {rank} failed: {record['error']}", file=sys.stderr)
                    return 1
                by_rank[rank] = record
        except (TimeoutError, queue.Empty) as exc:
            missing = sorted({0, 1} - set(by_rank))
            print(f"send_cost_bench: no result from worker(s) {missing} within the bound "
                  f"({type(exc).__name__})", file=sys.stderr)
            return 1
        finally:
            for proc in procs:
                proc.join(timeout=args.timeout)
                if proc.is_alive():
                    proc.kill()
                    proc.join(timeout=5)
        wall = time.perf_counter() - began
    sender, receiver = by_rank[0], by_rank[1]
    times = sender["times_ms"]
    if receiver["received"]["update"] != args.warmup + args.sends or sender["errors"] or receiver["errors"]:
        print(f"send_cost_bench: not every message arrived: {receiver} {sender['errors']}", file=sys.stderr)
        return 1
    ordered = sorted(times)
    record = {
        "what": "sender's time to post one Hop update (header + payload) and one token through PeerChannels",
        "commit": args.commit or _commit(), "date": datetime.date.today().isoformat(),
        "sends": args.sends, "warmup": args.warmup, "payload_bytes": args.numel * 4,
        "median_ms": statistics.median(times), "min_ms": ordered[0], "max_ms": ordered[-1],
        "p90_ms": ordered[int(0.9 * (len(ordered) - 1))], "mean_ms": statistics.fmean(times),
        "max_in_flight_seen": sender["max_in_flight_seen"], "received": receiver["received"],
        "wall_s": wall, "torch_threads": 1, "times_ms": times,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"one update ({args.numel * 4 / 1e6:.2f} MB) + one token, {args.sends} sends at {record['commit']} "
          f"({record['date']}): median {record['median_ms']:.3f} ms, min {record['min_ms']:.3f}, "
          f"max {record['max_ms']:.3f}, p90 {record['p90_ms']:.3f}; at most {record['max_in_flight_seen']} in "
          f"flight; {wall:.1f} s in all; {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
