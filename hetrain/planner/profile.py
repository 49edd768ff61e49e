"""Device files from measurements: this machine's local processes, or a Metis cluster description.

:func:`profile_local` starts ``workers`` gloo processes (one thread each, as
``hetrain plan --measure`` runs them) and measures, all at once so that they
share the machine as they will: float32 matmul FLOP/s of each process, and the
bytes per second each process receives while the two halves of the array
exchange large tensors both ways (the planner's per-device link figure), and
the time of one exchange round as ``--measure`` runs it (a barrier and a tiny
swap: ``link_latency_us``, which the search ignores but the comparison adds). The
device file it writes describes one kind, ``cpu``, with the slowest process's
figures, and an ``array`` of ``workers`` of them.

:func:`from_metis` reads Metis-style inputs (Um et al., ATC'24): a cluster file
``{host: {"instance_type", "inter_bandwidth", "intra_bandwidth", "memory"}}``
(bandwidths in bytes/s, memory in GB), an optional host file (``HOST GPUS`` per
line) and optional profile files ``DeviceType.<TYPE>_tp<T>_bs<B>.json`` whose
``execution_time.forward_backward_time_ms`` gives each type's speed relative to
a type the catalog knows. Link = the intra-node bandwidth, memory = ``memory``
(both finite positive numbers). Hosts of one type whose figures differ become
distinct kinds (``a100``, ``a100-2``, ...).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

from hetrain.errors import UsageError
from hetrain.planner.devices import CATALOG, GIB

MATMUL_N = 1024
MESSAGE_BYTES = 16 * 2**20


def _worker(ctx, seconds: float):
    return calibrate(ctx.rank, ctx.world_size, seconds)


def calibrate(rank: int, world: int, seconds: float) -> dict:
    """This process's float32 matmul FLOP/s and received bytes/s, measured while all ``world`` ranks do the same."""
    import torch
    import torch.distributed as dist

    a = torch.randn(MATMUL_N, MATMUL_N)
    b = torch.randn(MATMUL_N, MATMUL_N)
    torch.mm(a, b)
    dist.barrier()
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        reps += 1
    flops = 2.0 * MATMUL_N**3 * reps / (time.perf_counter() - start)
    half = (world + 1) // 2
    peer = rank + half if rank < half else rank - half
    send = torch.ones(MESSAGE_BYTES // 4)
    recv = torch.empty_like(send)
    rates = []
    for _ in range(4):
        dist.barrier()
        start = time.perf_counter()
        ops = []
        if peer < world:
            ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        if ops:
            rates.append(MESSAGE_BYTES / (time.perf_counter() - start))
    tiny_out, tiny_in = torch.ones(1), torch.empty(1)
    rounds = []
    for _ in range(20):  # one exchange round as the executor runs it: a barrier, then a small swap
        start = time.perf_counter()
        dist.barrier()
        if peer < world:
            for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, tiny_out, peer),
                                               dist.P2POp(dist.irecv, tiny_in, peer)]):
                req.wait()
        rounds.append(time.perf_counter() - start)
    rounds.sort()
    return {"flops_per_s": flops, "recv_bytes_per_s": max(rates) if rates else math.inf,
            "round_s": rounds[len(rounds) // 2]}


def profile_local(workers: int, seconds: float = 2.0, timeout_s: float = 120.0) -> dict:
    """Measure ``workers`` local processes; returns the figures and a device-file dict."""
    if not 2 <= workers <= 64:
        raise UsageError(f"--workers must be between 2 and 64, got {workers}")
    from hetrain.jobs import run_local

    results = run_local(_worker, workers, (seconds,), backend="gloo", timeout_s=timeout_s, job_timeout_s=timeout_s,
                        stoppable=False)
    flops = min(r["flops_per_s"] for r in results)
    link = min(r["recv_bytes_per_s"] for r in results)
    latency = max(r["round_s"] for r in results)
    memory_gib = _memory_gib() / workers
    for what, value in (("matmul FLOP/s", flops), ("received bytes/s", link), ("memory", memory_gib)):
        if not 0 < value < math.inf:
            raise UsageError(f"hetrain profile: measured {what} of {value:g}, which no device file can use; "
                             "measure longer (--seconds) or on a less loaded machine")
    spec = {"tflops": _rounded(flops / 1e12), "memory_gib": _rounded(memory_gib, 3),
            "link_gb_per_s": _rounded(link / 1e9), "link_latency_us": round(latency * 1e6, 1)}
    return {"workers": results, "device": spec,
            "file": {"devices": {"cpu": spec}, "array": f"cpu:{workers}"}}


def _rounded(value: float, digits: int = 6) -> float:
    """``value`` to ``digits`` decimals, or to 3 significant digits where that would round it to 0."""
    return round(value, digits) or float(f"{value:.3g}")


def _memory_gib() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB


def device_yaml(file: dict, comment: str) -> str:
    """The device file as YAML text (the format ``--devices`` reads), with a comment on top."""
    lines = [f"# {line}" for line in comment.splitlines()] + ["devices:"]
    for kind, spec in file["devices"].items():
        fields = ", ".join(f"{k}: {spec[k]}" for k in ("tflops", "memory_gib", "link_gb_per_s", "link_latency_us")
                           if k in spec)
        lines.append(f"  {kind}: {{{fields}}}")
    lines.append(f"array: {file['array']}")
    return "\n".join(lines) + "\n"


_PROFILE = re.compile(r"DeviceType\.(?P<type>[^_]+)_tp(?P<tp>\d+)_bs(?P<bs>\d+)\.json$")


def from_metis(cluster_path: str, hostfile: str | None = None, profiles: str | None = None) -> dict:
    """A device-file dict from Metis-style cluster, host and profile files (see the module doc)."""
    cluster = _read_json(cluster_path, "--metis-cluster")
    if not isinstance(cluster, dict) or not cluster or not all(
            isinstance(v, dict) and {"instance_type", "intra_bandwidth", "memory"} <= set(v) for v in cluster.values()):
        raise UsageError(f"--metis-cluster {cluster_path}: expected {{host: {{instance_type, inter_bandwidth, "
                         "intra_bandwidth, memory}}}} as Metis writes it")
    counts = _hostfile(hostfile) if hostfile else {host: 1 for host in cluster}
    speed = _relative_speed(profiles) if profiles else {}
    kinds, groups = {}, []
    for host, n in counts.items():
        if host not in cluster:
            raise UsageError(f"--metis-hostfile: host {host!r} is not in {cluster_path}")
        info = cluster[host]
        base = str(info["instance_type"]).strip().lower()
        if not base or any(c in base for c in ",:") or any(c.isspace() for c in base):
            raise UsageError(f"--metis-cluster {cluster_path}: host {host!r}: instance_type {info['instance_type']!r} "
                             "must be non-empty, without spaces, commas or colons")
        memory = _positive(cluster_path, host, "memory", info["memory"])
        intra = _positive(cluster_path, host, "intra_bandwidth", info["intra_bandwidth"])
        spec = {"tflops": _tflops(base, speed), "memory_gib": memory * 1e9 / GIB, "link_gb_per_s": intra / 1e9}
        if not all(0 < v < math.inf for v in spec.values()):
            raise UsageError(f"--metis-cluster {cluster_path}: host {host!r}: figures out of range once converted "
                             f"({spec}); use realistic values")
        # hosts of one type with different figures get distinct kinds (a100, a100-2, ...), not the last one's
        kind, k = base, 1
        while kind in kinds and kinds[kind] != spec:
            k += 1
            kind = f"{base}-{k}"
        kinds[kind] = spec
        groups.append(f"{kind}:{n}")
    return {"devices": kinds, "array": ",".join(groups)}


def _positive(path, host, field, value) -> float:
    """A finite positive JSON number from the cluster file, or a one-line error."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        number = float(value) if ok else math.nan
    except OverflowError:
        number = math.inf
    if not 0 < number < math.inf:
        raise UsageError(f"--metis-cluster {path}: host {host!r}: {field} must be a finite positive number, "
                         f"got {str(repr(value))[:40]}")
    return number


def _read_json(path, flag):
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read it ({exc.strerror})") from None
    except ValueError as exc:
        raise UsageError(f"{flag} {path}: not valid JSON ({exc})") from None


def _hostfile(path: str) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"--metis-hostfile {path}: cannot read it ({exc.strerror})") from None
    counts = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or not parts[1].isdigit() or int(parts[1]) < 1:
            raise UsageError(f"--metis-hostfile {path}: write 'HOST GPUS' per line, got {line.strip()!r}")
        counts[parts[0]] = int(parts[1])
    return counts


def _relative_speed(directory: str) -> dict:
    """Type -> steps per second of the same (model, tp, batch) profile, from Metis profile files."""
    d = Path(directory)
    if not d.is_dir():
        raise UsageError(f"--metis-profiles {directory}: not a directory")
    by_setting: dict = {}
    for f in sorted(d.iterdir()):
        m = _PROFILE.search(f.name)
        if not m:
            continue
        data = _read_json(f, "--metis-profiles")
        try:
            ms = float(data["execution_time"]["forward_backward_time_ms"])
        except (KeyError, TypeError, ValueError, OverflowError):
            raise UsageError(f"--metis-profiles: {f.name} has no execution_time.forward_backward_time_ms") from None
        if not 0 < ms < math.inf:
            raise UsageError(f"--metis-profiles: {f.name}: forward_backward_time_ms must be a finite positive "
                             f"number, got {ms}")
        by_setting.setdefault((m["tp"], m["bs"]), {})[m["type"].lower()] = 1.0 / ms
    # the setting profiled on the most types
    return max(by_setting.values(), key=len) if by_setting else {}


def _tflops(kind: str, speed: dict) -> float:
    if kind in CATALOG:
        return CATALOG[kind].flops_per_s / 1e12
    refs = [k for k in speed if k in CATALOG]
    if kind in speed and refs:
        ref = refs[0]
        return CATALOG[ref].flops_per_s / 1e12 * speed[kind] / speed[ref]
    raise UsageError(f"Metis instance type {kind!r} is not in the catalog ({', '.join(sorted(CATALOG))}) and no "
                     "profile relates it to one; pass --metis-profiles with DeviceType.<TYPE>_tp*_bs*.json files "
                     "of both")
