"""``hetrain profile``: write a planner device file from measurements (or from Metis-style files)."""

from __future__ import annotations

import argparse
import datetime
import math
import platform

from hetrain.errors import UsageError

HELP = "measure this machine's FLOP/s and gloo bandwidth (or read Metis files) into a planner device file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="device file to write (.yaml, .yml or .json)")
    parser.add_argument("--workers", type=int, default=2,
                        help="local processes measured at once, one per planned device (default 2)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds of matmul per process (default 3)")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="limit for the measuring job (seconds)")
    parser.add_argument("--metis-cluster", help="convert a Metis cluster file instead of measuring")
    parser.add_argument("--metis-hostfile", help="with --metis-cluster: 'HOST GPUS' lines (default: 1 per host)")
    parser.add_argument("--metis-profiles",
                        help="with --metis-cluster: directory of DeviceType.<TYPE>_tp<T>_bs<B>.json profiles, "
                             "for types the catalog does not know")


def run(args: argparse.Namespace) -> int:
    from hetrain.planner import profile

    if not args.out.endswith((".yaml", ".yml", ".json")):
        raise UsageError(f"--out {args.out}: name a .yaml, .yml or .json file")
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    if args.metis_cluster:
        file = profile.from_metis(args.metis_cluster, args.metis_hostfile, args.metis_profiles)
        comment = f"hetrain profile, {when}: converted from Metis cluster file {args.metis_cluster}"
        summary = f"{len(file['devices'])} device kinds, array {file['array']}"
    else:
        if not 0 < args.seconds < math.inf:
            raise UsageError(f"--seconds must be a finite positive number, got {args.seconds}")
        if not 0 < args.timeout_s < math.inf:
            raise UsageError(f"--timeout-s must be a finite positive number, got {args.timeout_s}")
        measured = profile.profile_local(args.workers, args.seconds, args.timeout_s)
        file, spec = measured["file"], measured["device"]
        comment = (f"hetrain profile, {when}, {platform.node()}: {args.workers} gloo processes at once, one thread "
                   f"each;\nfloat32 {profile.MATMUL_N}^3 matmul for {args.seconds:g} s, "
                   f"{profile.MESSAGE_BYTES >> 20} MiB exchanged both ways between the halves; slowest process")
        summary = (f"{args.workers} processes: {spec['tflops'] * 1e3:.1f} GFLOP/s, "
                   f"{spec['link_gb_per_s']:.2f} GB/s received, {spec['memory_gib']:.1f} GiB each")
    from hetrain.outputs import write_json_atomic, write_text_atomic

    try:
        if args.out.endswith(".json"):
            write_json_atomic(args.out, {"comment": comment, **file})
        else:
            write_text_atomic(args.out, profile.device_yaml(file, comment))
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot write ({exc.strerror}); choose a writable path") from None
    print(f"wrote {args.out}: {summary}")
    return 0
