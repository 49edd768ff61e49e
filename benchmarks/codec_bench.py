"""Codec benchmark: what each ``--compress`` code, and the one-bit code beside it, costs a core.

    .venv/bin/python benchmarks/codec_bench.py                          # 25M values (the soak's model), 1 thread
    .venv/bin/python benchmarks/codec_bench.py --numel 4810 --repeats 50 --out runs/codec

For each code: the median of ``--repeats`` timed encodes and decodes of one random float32 vector of
``--numel`` values (after one untimed call each), on one thread (a worker's share of a small machine),
and the payload's bytes per value. ``--codes`` takes any ``--compress`` code
(``powersgd:R`` sees one 1-D vector here, which it sends whole: time it on a real model instead). ``one-bit`` is the scaled-sign code that carries the outer momentum
(Hop, D-PSGD) or the anchors (Prague, AD-PSGD) beside a compressed model. A gossip message costs its
sender one encode and one decode (its public copy moves by what it sent) and each receiver one decode;
a compressed P-Reduce costs each member one encode and a decode per member. Writes OUT/codec.json and
OUT/codec.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from hetrain.compression.codecs import ScaledSign, make_codec
from hetrain.compression.spec import CompressionSpec

CODES = ("int8", "int4", "bf16", "topk:0.01", "one-bit")


def codec_of(code: str, numel: int):
    if code == "one-bit":
        return ScaledSign(CompressionSpec.parse("int8"), numel)
    return make_codec(code, numel)


def median_ms(call, repeats: int) -> float:
    call()  # the first call allocates
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return 1e3 * statistics.median(times)


def measure(codes: list[str], numel: int, repeats: int, seed: int = 0) -> list[dict]:
    x = torch.randn(numel, generator=torch.Generator().manual_seed(seed))
    rows = []
    for code in codes:
        codec = codec_of(code, numel)
        payload = codec.encode(x)
        rows.append({"code": code, "numel": numel, "bytes_per_value": payload.numel() / numel,
                     "encode_ms": median_ms(functools.partial(codec.encode, x), repeats),
                     "decode_ms": median_ms(functools.partial(codec.decode, payload), repeats)})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| code | values | bytes/value | encode (ms) | decode (ms) |", "|---|---|---|---|---|"]
    lines += [f"| {r['code']} | {r['numel']:,} | {r['bytes_per_value']:.3f} | {r['encode_ms']:.1f} | "
              f"{r['decode_ms']:.1f} |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--numel", type=int, default=25_000_000, help="values in the vector (default 25M)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each (default 5)")
    parser.add_argument("--codes", default=",".join(CODES),
                        help=f"comma-separated --compress codes or one-bit (default {','.join(CODES)})")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", default="runs/codec")
    args = parser.parse_args()
    codes = args.codes.split(",")
    for code in codes:
        if code != "one-bit":
            try:
                CompressionSpec.parse(code)
            except ValueError as error:
                parser.error(f"--codes {code}: {error}, or one-bit")
    if args.numel < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--numel, --repeats and --threads must be at least 1")
    torch.set_num_threads(args.threads)
    rows = measure(codes, args.numel, args.repeats)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "codec.json").write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=2) + "\n")
    (out / "codec.md").write_text(markdown(rows) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
