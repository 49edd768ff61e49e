"""The rate board's load on one c10d store as workers grow (``--data-split balanced``).

    .venv/bin/python benchmarks/rate_board_scale.py --workers 16,64,256 --seconds 20 --out runs/rate_board

Every worker of a balanced job writes its batch count to the job's store every 0.5 s and reads all
n counts (one ``multi_get``): n^2 key reads a second per refresh period on one TCPStore. Here one
store (``torch.distributed.TCPStore``, as the launcher's) and n client threads, each with its own
connection and its own :class:`~hetrain.jobs.rate_board.RateBoard`, count batches at 20 a second (a
worker's speed in the demo; every eighth thread at 4, a straggler) and call ``note`` after each, as
``train_worker`` does. Measured: the time of each refresh (a ``note`` that reached the store), its
median and 99th percentile, how late refreshes fall behind their 0.5 s period, and each board's
last rates before 80% of the run (no thread has ended yet): whether they put every straggler below
0.9 of the fair rate (what the balanced split acts on) and their worst error against the true speeds
(a count is read up to a refresh period after it was written, so a 2 s window is good to about 25%). Threads share one process (the store
client releases the GIL while it waits), so the figures are the store's and this machine's, not a
cluster's: an upper bound on the cost per worker at that n.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch.distributed as dist

from hetrain.jobs.rate_board import REFRESH_S, RateBoard

FAST_BATCHES_PER_S = 20.0
SLOW_EVERY = 8  # every eighth worker is a straggler
SLOW_FACTOR = 5.0


def _worker(rank: int, n: int, port: int, seconds: float, out: dict, start: threading.Barrier) -> None:
    store = dist.TCPStore("127.0.0.1", port, n + 1, False, timeout=datetime.timedelta(seconds=60))
    board = RateBoard(store, rank, n)
    start.wait(120)  # every worker connected: the clocks start together
    step_s = 1.0 / FAST_BATCHES_PER_S * (SLOW_FACTOR if rank % SLOW_EVERY == 0 else 1.0)
    refreshes, rates, computed = [], None, 0
    began = time.monotonic()
    next_batch = began
    while time.monotonic() - began < seconds:
        next_batch += step_s
        time.sleep(max(0.0, next_batch - time.monotonic()))
        computed += 1
        before = board._at
        t0 = time.perf_counter()
        got = board.note(computed)
        if board._at is not before:  # this call reached the store
            refreshes.append((time.monotonic() - began, time.perf_counter() - t0))
        if got is not None and time.monotonic() - began < 0.8 * seconds:  # before any thread ends
            rates = got
    out[rank] = {"refreshes": refreshes, "rates": rates}


def measure(n: int, seconds: float) -> dict:
    master = dist.TCPStore("127.0.0.1", 0, n + 1, True, timeout=datetime.timedelta(seconds=60),
                           wait_for_workers=False)
    out: dict[int, dict] = {}
    start = threading.Barrier(n)
    threads = [threading.Thread(target=_worker, args=(r, n, master.port, seconds, out, start), daemon=True)
               for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 120)
    if len(out) != n:
        raise SystemExit(f"{n} workers: only {len(out)} finished within {seconds + 120:.0f} s")
    durations = sorted(d for r in out.values() for _, d in r["refreshes"])
    gaps = [b[0] - a[0] for r in out.values() for a, b in zip(r["refreshes"], r["refreshes"][1:])]
    errors, stragglers_seen = [], 0
    true = [FAST_BATCHES_PER_S / (SLOW_FACTOR if j % SLOW_EVERY == 0 else 1.0) for j in range(n)]
    for r in out.values():
        rates = r["rates"]
        if rates is None:
            continue
        errors.append(max(abs(rate / speed - 1.0) for rate, speed in zip(rates, true)))
        fair = sum(rates) / n
        stragglers_seen += all(rates[j] < 0.9 * fair for j in range(0, n, SLOW_EVERY))
    return {
        "workers": n,
        "seconds": seconds,
        "refreshes": len(durations),
        "refresh_ms_median": 1000 * statistics.median(durations),
        "refresh_ms_p99": 1000 * durations[int(0.99 * (len(durations) - 1))],
        "period_s_median": statistics.median(gaps),
        "period_s_p99": sorted(gaps)[int(0.99 * (len(gaps) - 1))],
        "boards_with_rates": sum(r["rates"] is not None for r in out.values()),
        "boards_that_see_the_stragglers": stragglers_seen,
        "worst_rate_error_median": statistics.median(errors) if errors else None,
        "worst_rate_error_max": max(errors) if errors else None,
        "key_reads_per_s": len(durations) * n / seconds,
    }


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def markdown(rows: list[dict]) -> str:
    lines = ["| workers | refreshes | refresh median (ms) | refresh p99 (ms) | period median / p99 (s) "
             "| boards with rates | boards that see every straggler | worst rate error, median / max | key reads/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workers']} | {r['refreshes']} | {r['refresh_ms_median']:.2f} | {r['refresh_ms_p99']:.2f} "
                     f"| {r['period_s_median']:.3f} / {r['period_s_p99']:.3f} | {r['boards_with_rates']} of {r['workers']} "
                     f"| {r['boards_that_see_the_stragglers']} | {_pct(r['worst_rate_error_median'])} / {_pct(r['worst_rate_error_max'])} "
                     f"| {r['key_reads_per_s']:.0f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="16,64,256", help="comma-separated worker counts")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of counting per size")
    parser.add_argument("--out", default="runs/rate_board")
    args = parser.parse_args()
    try:
        sizes = [int(w) for w in args.workers.split(",")]
    except ValueError:
        print(f"--workers: comma-separated integers, got {args.workers!r}", file=sys.stderr)
        return 2
    if args.seconds < 4 * REFRESH_S * 2:
        print(f"--seconds: at least {4 * REFRESH_S * 2:.0f} (the board's window must pass)", file=sys.stderr)
        return 2
    rows = []
    for n in sizes:
        rows.append(measure(n, args.seconds))
        print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rate_board.json").write_text(json.dumps(rows, indent=1))
    (out / "rate_board.md").write_text(markdown(rows) + "\n")
    print(markdown(rows))
    print(f"wrote {out / 'rate_board.json'} and {out / 'rate_board.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
