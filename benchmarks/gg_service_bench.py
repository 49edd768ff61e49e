"""The Group Generator service's capacity: requests/s and latency, in process and over TCP.

    .venv/bin/python benchmarks/gg_service_bench.py --out runs/gg-service
    .venv/bin/python benchmarks/gg_service_bench.py --workers 1024 --clients 2 8 --duration 10

(a) In process: one thread calls ``SchedulerHost.handle`` for worker after
worker, as fast as it can — the pure scheduler plus its lock, the floor of the
service time. (b) Over TCP: the real ``GGServer`` (a thread per connection,
JSON lines, one lock around the scheduler) and C client processes, each a
``SocketClient`` per worker it plays, asking in a closed loop (no compute
between requests) for ``--duration`` seconds: job-wide requests/s, and p50 /
p99 of a request's round trip. Clients and server share this machine's cores,
so (b) is a lower bound of what a dedicated GG host would serve. The
simulator charges ``hetrain simulate --gg-service-us`` per request; the
figures calibrate it (docs/guides/simulator.md). Writes OUT/gg_service.md and .json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

from hetrain.groups.gg_service import GGServer, SchedulerHost, SocketClient
from hetrain.protocols.group_generator import GroupGenerator


def in_process(workers: int, mode: str, duration_s: float) -> dict:
    host = SchedulerHost(GroupGenerator(workers, 2, mode, seed=0))
    count, began = 0, time.perf_counter()
    while time.perf_counter() - began < duration_s:
        for worker in range(workers):
            host.handle({"op": "request", "worker": worker})
        count += workers
    elapsed = time.perf_counter() - began
    return {"where": "in process", "mode": mode, "workers": workers, "clients": 0,
            "requests_per_s": count / elapsed, "service_us": 1e6 * elapsed / count}


def _client(address: str, secret: str, workers: list[int], duration_s: float, start_at: float, out) -> None:
    clients = [SocketClient.to(w, address, secret, timeout_s=60) for w in workers]
    while time.time() < start_at:
        time.sleep(0.001)
    latencies, deadline = [], time.perf_counter() + duration_s
    while time.perf_counter() < deadline:
        for client in clients:
            t0 = time.perf_counter()
            client.request()
            latencies.append(time.perf_counter() - t0)
    for client in clients:
        client.close()
    out.put(latencies)


def over_tcp(workers: int, mode: str, clients: int, duration_s: float) -> dict:
    server = GGServer(GroupGenerator(workers, 2, mode, seed=0), host="127.0.0.1")
    address = f"{server.host}:{server.port}"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0 + 0.5 * clients  # every client connected before anyone asks
    procs = [ctx.Process(target=_client, args=(address, server.secret, list(range(c, workers, clients)), duration_s,
                                               start_at, out)) for c in range(clients)]
    for p in procs:
        p.start()
    latencies = []
    for _ in procs:
        latencies += out.get(timeout=duration_s + 120)
    for p in procs:
        p.join(timeout=30)
    server.close()
    latencies.sort()
    return {"where": "TCP", "mode": mode, "workers": workers, "clients": clients,
            "requests_per_s": len(latencies) / duration_s, "service_us": 1e6 * duration_s / len(latencies),
            "p50_ms": 1e3 * statistics.median(latencies), "p99_ms": 1e3 * latencies[int(0.99 * (len(latencies) - 1))]}


def markdown(rows: list[dict]) -> str:
    lines = ["| where | GG mode | workers | client processes | requests/s | us per request | p50 round trip (ms) "
             "| p99 round trip (ms) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['where']} | {r['mode']} | {r['workers']} | {r['clients'] or '-'} | "
                     f"{r['requests_per_s']:.0f} | {r['service_us']:.1f} | "
                     f"{r.get('p50_ms', float('nan')):.2f} | {r.get('p99_ms', float('nan')):.2f} |".replace("nan", "-"))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/gg-service")
    parser.add_argument("--workers", type=int, default=1024, help="workers the GG schedules (default 1024)")
    parser.add_argument("--modes", nargs="+", default=["smart", "random"])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 8], help="client processes for (b)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement (default 10)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in args.modes:
        rows.append(in_process(args.workers, mode, args.duration))
        for clients in args.clients:
            rows.append(over_tcp(args.workers, mode, clients, args.duration))
        print(markdown(rows[-1 - len(args.clients):]), file=sys.stderr, flush=True)
    (out / "gg_service.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "gg_service.md").write_text(markdown(rows))
    print(markdown(rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
