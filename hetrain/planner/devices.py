"""Accelerators: a catalog of public peak figures, one's own in a YAML/JSON file, and array specs.

An array spec lists groups in order, ``kind:count`` separated by commas, e.g.
``tpu-v3:4,tpu-v2:4`` or ``a100:8``. The planner splits the resulting device
list in halves recursively (left half = the first ``ceil(n/2)`` devices).

Figures are per chip, dense 16-bit peak (no sparsity); ``link_bytes_per_s`` is
one direction of the chip's accelerator interconnect (ICI or NVLink). They are
public, rounded, and only as good as peak figures are: see docs/guides/planner.md.

A device file (``.yaml``, ``.yml`` or ``.json``) looks like::

    devices:
      my-npu: {tflops: 200, memory_gib: 48, link_gb_per_s: 100}
    array: my-npu:4,a100:4     # optional: used when the file is passed as SPEC

Figures must be finite and positive (the latency may be 0); kind names are
read in lower case, as array specs are. An array holds at most
:data:`MAX_DEVICES` devices.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from hetrain.errors import UsageError

GIB = 2**30
MAX_DEVICES = 65_536  # devices in one array, all groups together


@dataclass(frozen=True)
class Device:
    """One accelerator: peak FLOP/s, memory bytes, link bytes/s (one direction)."""

    kind: str
    flops_per_s: float
    memory_bytes: float
    link_bytes_per_s: float
    link_latency_s: float = 0.0  # per exchange round; not used by the search, added to --measure's prediction


def _dev(kind: str, tflops: float, memory_gib: float, link_gb_per_s: float, latency_us: float = 0.0) -> Device:
    return Device(kind, tflops * 1e12, memory_gib * GIB, link_gb_per_s * 1e9, latency_us * 1e-6)


CATALOG: dict[str, Device] = {d.kind: d for d in (
    _dev("tpu-v2", 45.0, 16.0, 62.5),    # Cloud TPU v2 chip: 45 TFLOPS bf16, 16 GiB HBM
    _dev("tpu-v3", 123.0, 32.0, 82.0),   # Cloud TPU v3 chip: 123 TFLOPS bf16, 32 GiB HBM
    _dev("v100", 125.0, 32.0, 150.0),    # V100 SXM2: 125 TFLOPS tensor fp16, NVLink2 300 GB/s both ways
    _dev("a100", 312.0, 80.0, 300.0),    # A100 SXM: 312 TFLOPS bf16 dense, NVLink3 600 GB/s both ways
    _dev("h100", 989.0, 80.0, 450.0),    # H100 SXM: 989 TFLOPS bf16 dense, NVLink4 900 GB/s both ways
)}


def load_device_file(path: str | Path) -> tuple[dict[str, Device], str | None]:
    """Read custom device kinds (and an optional ``array`` spec) from a YAML or JSON file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"device file {path}: cannot read it ({exc.strerror}); check the path") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # noqa: BLE001 - any parse error is the user's file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"device file {path}: not valid {path.suffix[1:].upper()} ({first})") from None
    if not isinstance(data, dict) or not isinstance(data.get("devices", {}), dict):
        raise UsageError(f"device file {path}: expected a mapping with a 'devices' mapping; see docs/guides/planner.md")
    kinds = {}
    for kind, spec in (data.get("devices") or {}).items():
        name = str(kind).strip().lower()  # array specs are read in lower case: so are the kinds
        if not name or any(c in name for c in ",:") or any(c.isspace() for c in name):
            raise UsageError(f"device file {path}: device name {str(kind)!r} must be non-empty, without spaces, "
                             "commas or colons")
        if name in kinds:
            raise UsageError(f"device file {path}: device {name!r} is described twice (names ignore case)")
        kinds[name] = _parse_kind(path, name, spec)
    array = data.get("array")
    if array is not None and not isinstance(array, str):
        raise UsageError(f"device file {path}: 'array' must be a string like 'my-npu:4,a100:4'")
    return kinds, array


def _parse_kind(path: Path, kind: str, spec) -> Device:
    fields = ("tflops", "memory_gib", "link_gb_per_s")
    if not isinstance(spec, dict) or not set(fields) <= set(spec) <= {*fields, "link_latency_us"}:
        raise UsageError(f"device file {path}: device {kind!r} needs exactly the fields {', '.join(fields)} "
                         "(and optionally link_latency_us)")
    latency = spec.get("link_latency_us", 0.0)
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not 0 <= _float(latency) < math.inf:
        raise UsageError(f"device file {path}: device {kind!r}: link_latency_us must be a finite number >= 0, "
                         f"got {_show(latency)}")
    values = []
    for name in fields:
        value = spec[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < _float(value) < math.inf:
            raise UsageError(f"device file {path}: device {kind!r}: {name} must be a finite positive number, "
                             f"got {_show(value)}")
        values.append(float(value))
    device = _dev(kind, *values, latency_us=float(latency))
    scaled = (device.flops_per_s, device.memory_bytes, device.link_bytes_per_s)
    if not all(0 < v < math.inf for v in scaled) or not device.link_latency_s < math.inf:
        raise UsageError(f"device file {path}: device {kind!r}: a figure is out of range once converted to "
                         "FLOP/s, bytes and bytes/s; use realistic values")
    return device


def _float(value) -> float:
    """``value`` as a float; an integer too large for one becomes infinity (refused like it)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_array(spec: str, extra: dict[str, Device] | None = None) -> list[Device]:
    """``'tpu-v3:4,tpu-v2:4'`` (or a device file path) -> the ordered device list."""
    spec = (spec or "").strip()
    if spec.endswith((".yaml", ".yml", ".json")):
        kinds, array = load_device_file(spec)
        if array is None:
            raise UsageError(f"device file {spec}: has no 'array' entry; add one like array: my-npu:4")
        extra = {**(extra or {}), **kinds}
        spec = array
    known = {**CATALOG, **(extra or {})}
    devices: list[Device] = []
    for part in spec.split(","):
        kind, sep, count = part.strip().partition(":")
        kind = kind.strip().lower()
        if not kind:
            raise UsageError(f"--devices {spec!r}: empty group; write groups like tpu-v3:4,tpu-v2:4")
        if kind not in known:
            raise UsageError(f"--devices: unknown device {kind!r}; known: {', '.join(sorted(known))} "
                             "(or describe it in a YAML/JSON device file)")
        try:
            n = int(count) if sep else 1
        except ValueError:
            raise UsageError(f"--devices: count {count!r} of {kind} is not an integer") from None
        if n < 1:
            raise UsageError(f"--devices: count of {kind} must be at least 1, got {n}")
        if len(devices) + n > MAX_DEVICES:
            raise UsageError(f"--devices {spec!r}: at most {MAX_DEVICES:,} devices in all")
        devices.extend([known[kind]] * n)
    if len(devices) < 2:
        raise UsageError(f"--devices {spec!r}: the planner needs at least 2 devices to split a layer")
    return devices


def describe(devices: list[Device]) -> str:
    """Compact spec string of a device list: consecutive equal kinds grouped."""
    groups: list[list] = []
    for d in devices:
        if groups and groups[-1][0] == d.kind:
            groups[-1][1] += 1
        else:
            groups.append([d.kind, 1])
    return ",".join(f"{k}:{n}" for k, n in groups)
