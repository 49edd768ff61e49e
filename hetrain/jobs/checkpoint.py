"""Checkpoints: each worker's model, optimizer, data position, RNG and protocol state, written atomically.

Layout of ``--checkpoint-dir DIR``:

- ``DIR/manifest.json``: the run's configuration fingerprint (what must match
  to resume: protocol, workers, workload, model size (synthetic only), batch, optimizer (momentum: SGD only), seed,
  protocol options, an edge file's topology by its edges' digest), written by the launcher before any worker starts;
- ``DIR/torchrun.json``: under torchrun, the run id of the job that trains from DIR (a restart of that
  job with nothing left to train finishes it: :mod:`hetrain.jobs.torchrun_restart`);
- ``DIR/worker-<rank>.pt``: one file per worker, replaced atomically (written
  to a temporary file in DIR, then ``os.replace``), so a crash mid-write leaves
  the previous checkpoint intact.

Loading uses ``torch.load(weights_only=True)``: a checkpoint holds tensors,
numbers, strings and containers only and can execute nothing. ``--resume``
continues from the checkpoints in DIR (or starts fresh when DIR holds none,
so the same command line works for a job's first start and for torchrun's
restarts, also when some workers had written no file yet: all start afresh); a
checkpoint of another configuration, or an unreadable worker file, is refused
before any worker starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from hetrain.comm import settings as comm_carrier
from hetrain.protocols.options import OptionError
from hetrain.topology import TOPOLOGIES

FORMAT = 1
MANIFEST = "manifest.json"
FINGERPRINT_FIELDS = ("protocol", "num_workers", "workload", "model_params", "batch_size", "data_split", "momentum",
                      "seed")
def comm_fingerprint(comm) -> dict:
    """The communication settings a checkpoint's protocol state depends on (outer anchor and momentum, local-step
    position, compression replicas): those :class:`~hetrain.comm.settings.CommSettings` marks ``state`` (the
    emulated link is the network's, not the state's), resolved (an outer optimizer's lr and momentum only when
    there is one)."""
    stateful = comm_carrier.state_settings()
    data = {name: value for name, value in comm.as_dict().items() if name in stateful}
    if data.get("outer_optimizer") == "none":  # no outer optimizer: its lr and momentum mean nothing
        data["outer_lr"] = data["outer_momentum"] = None
    if "gossip_step" in data:
        if data.get("compression", "none") == "none":  # no compression: no consensus step
            data["gossip_step"] = None
        elif data["gossip_step"] is None and comm.compression.kind not in ("topk", "powersgd"):
            data["gossip_step"] = 1.0  # the quantizers' default, as given or not (topk's and powersgd's need the model)
    return data


def options_fingerprint(config, options: dict) -> dict:
    """The protocol's ``options`` resolved: defaults filled in, and Hop's and D-PSGD's as their graph
    resolves them (``--backup 1`` typed on a ring is Hop's default), as JSON would read them back. A
    topology read from an edge file is its edges' digest, not the file's path: a file edited between
    the run and its resume is another graph."""
    made = config.protocol_spec.make_options(options)
    data = dataclasses.asdict(made)
    if hasattr(made, "resolve"):
        topology, resolved = made.resolve(config.num_workers)
        data.update(vars(resolved))
        if topology.name not in TOPOLOGIES:
            data["topology"] = edges_digest(topology.edges)
    return json.loads(json.dumps(dict(sorted(data.items())), default=str))


def edges_digest(edges) -> str:
    """A graph's edges as a short digest (``edges sha256:...``): the same for the same edges, in any order."""
    text = "\n".join(f"{src} {dst}" for src, dst in sorted(edges))
    return "edges sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _first_difference(saved: dict, expected: dict) -> tuple[str, object, object] | None:
    """The first setting (the fingerprint's order; a protocol option by its own name) whose value differs:
    (name, saved value, this run's value), or None."""
    for name in list(expected) + [k for k in saved if k not in expected]:
        was, now = saved.get(name), expected.get(name)
        if was == now:
            continue
        if name == "options" and isinstance(was, dict) and isinstance(now, dict) and saved.get("protocol") == \
                expected.get("protocol"):
            names = sorted(set(now) | set(was), key=lambda k: k != "topology")  # the graph first: defaults follow it
            option = next(k for k in names if was.get(k) != now.get(k))
            return option, was.get(option), now.get(option)
        return name, was, now
    return None


def fingerprint(config) -> dict:
    """What a resumed run must share with the run that wrote the checkpoint (resolved values)."""
    data = {name: getattr(config, name) for name in FINGERPRINT_FIELDS}
    data.update(optimizer=config.resolved_optimizer(), lr=config.resolved_lr(),
                options=options_fingerprint(config, config.options), **comm_fingerprint(config.comm_settings()))
    return _without_unused(data)


def _without_unused(data: dict) -> dict:
    """Settings the run does not read, as None: ``model_params`` sizes the synthetic model only, ``momentum`` is
    SGD's, ``gossip_step`` is gossip's (a resume that types another value for either is the same run; it was
    refused)."""
    if data.get("workload") != "synthetic":
        data["model_params"] = None
    if data.get("optimizer") != "sgd":
        data["momentum"] = None
    if data.get("protocol") == "allreduce" and "gossip_step" in data:
        data["gossip_step"] = None  # no gossip: DDP's hooks take no consensus step
    return data


def worker_path(directory, rank: int) -> Path:
    return Path(directory) / f"worker-{rank}.pt"


def prepare(directory: str, config, resume: bool, finished_ok: bool = False) -> bool:
    """Launcher side, before anything is written: True when the run resumes from DIR's checkpoints.

    ``finished_ok``: checkpoints with nothing left to train are resumed (the job then only finishes:
    a torchrun restart after a death past the last checkpoint, :mod:`hetrain.jobs.torchrun_restart`);
    else they are refused. Refuses (one-line OptionError; ``{checkpoint_dir}``, ``{resume}`` read as flags on the command
    line) a DIR that is not a directory, checkpoints of another configuration, unreadable worker
    files, and checkpoints that a run without ``resume`` would overwrite. Writes nothing: :func:`start` does.
    """
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise OptionError(f"{{checkpoint_dir}} {path}: exists and is not a directory")
    manifest = path / MANIFEST
    has_checkpoints = manifest.exists() or any(path.glob("worker-*.pt")) if path.exists() else False
    if not resume:
        if has_checkpoints:
            raise OptionError(f"{{checkpoint_dir}} {path} holds checkpoints of a run; pass {{resume}} to continue it, "
                              "or choose an empty directory")
        return False
    if not has_checkpoints:
        return False  # nothing to resume from: a fresh start (a torchrun job's first attempt)
    try:
        saved = json.loads(manifest.read_text())
    except (OSError, ValueError) as exc:
        raise OptionError(f"{{resume}}: {manifest} is missing or unreadable ({exc}); it is not a hetrain "
                          "checkpoint directory") from None
    expected = json.loads(json.dumps(fingerprint(config)))  # the same JSON round trip as the saved one
    for name, default in comm_fingerprint(comm_carrier.CommSettings()).items():  # a manifest written before they were
        saved.setdefault(name, default)  # recorded: the defaults
    saved.setdefault("data_split", "shard")  # likewise
    saved = _without_unused(saved)  # a manifest written before unused settings were left out
    if saved.get("protocol") == config.protocol and isinstance(saved.get("options"), dict):
        try:  # a manifest written before the options were recorded resolved held them as typed
            saved["options"] = options_fingerprint(config, saved["options"])
        except (OptionError, TypeError, ValueError):
            pass  # not options this version reads: they differ
    differing = _first_difference(saved, expected)
    if differing is not None:
        name, was, now = differing
        flag = comm_carrier.state_settings().get(name, "{" + name + "}")
        raise OptionError(f"{{resume}}: the checkpoint in {path} was written with {flag} {was!r}, this run has "
                          f"{now!r}; resume with the settings it was written with, or choose another "
                          "{checkpoint_dir}")
    present = [rank for rank in range(config.num_workers) if worker_path(path, rank).exists()]
    if len(present) < config.num_workers:
        # the run died before its first checkpoint, or before every worker had written one (torchrun
        # restarts land here): a fresh start for all, as the workers' files must be of one run
        if present:
            warnings.warn(f"not resuming from {path}: {len(present)} of {config.num_workers} workers had "
                          "written a checkpoint when the run died; starting afresh", stacklevel=2)
        return False
    reached = []  # every worker file readable, before anyone starts (one in memory at a time)
    for rank in range(config.num_workers):
        reached.append(int(load_worker(path, rank).get("protocol", {}).get("iteration", 0)))
    if config.protocol_spec.runtime_class()._steps_together:
        reached = reached[:1]  # every replica resumes from rank 0's state
    if finished_ok and config.iterations is not None and min(reached) >= config.iterations:
        print(f"hetrain: the checkpoints in {path} are at iteration {min(reached)} of --iterations "
              f"{config.iterations}: this restart trains nothing and finishes the job", file=sys.stderr)
    else:
        iterations_left(path, config, reached)
    return True


def iterations_left(path: Path, config, reached: list[int]) -> None:
    """Refuse a resume with nothing left to train: ``iterations`` is the job's total, every worker (of those
    whose state the workers resume from) past it."""
    if config.iterations is not None and min(reached) >= config.iterations:
        raise OptionError(f"{{resume}}: the checkpoints in {path} are at iteration {min(reached)} or later, and "
                          f"{{iterations}} {config.iterations} counts from the job's start, so nothing is left to "
                          f"train; give {{iterations}} above {max(reached)} to train on")


def start(directory: str, config, resumed: bool) -> None:
    """Create DIR and, on a fresh start, write its manifest and remove worker files of a run that died
    before every worker had written one; remove writes a death cut short (after every check passed)."""
    if not resumed:
        _write_manifest(Path(directory), config)
        for stale in Path(directory).glob("worker-*.pt"):
            stale.unlink()
    for partial in Path(directory).glob(".worker-*.pt.*"):  # a write cut short by a death (no writer is alive now)
        partial.unlink(missing_ok=True)


def _write_manifest(path: Path, config) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        _write_atomic(path / MANIFEST, (json.dumps(fingerprint(config), indent=2) + "\n").encode())
    except OSError as exc:
        raise OptionError(f"{{checkpoint_dir}} {path}: not writable ({exc.strerror})") from None


def load_worker(directory, rank: int) -> dict:
    """Worker ``rank``'s checkpoint (weights_only: tensors, numbers, strings, containers)."""
    file = worker_path(directory, rank)
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise OptionError(f"{{resume}}: {file} is missing (a checkpoint needs every worker's file)") from None
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise OptionError(f"{{resume}}: {file} is not a readable checkpoint ({type(exc).__name__}); "
                          "remove the directory or resume from another") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("rank") != rank:
        raise OptionError(f"{{resume}}: {file} is not a hetrain worker checkpoint for worker {rank}")
    return state


def save_worker(directory, rank: int, state: dict) -> None:
    """Write worker ``rank``'s checkpoint atomically."""
    file = worker_path(directory, rank)
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save({"format": FORMAT, "rank": rank, **state}, handle)
            _flush_to_disk(handle)
        os.replace(tmp, file)
        _flush_directory(file.parent)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_atomic(file: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        _flush_to_disk(handle)
    os.replace(tmp, file)
    _flush_directory(file.parent)


def _flush_to_disk(handle) -> None:
    """The file's bytes on disk before its rename: a rename is atomic against a process's death, and against
    a machine's crash only once the data it points to was written (else some filesystems bring back an empty
    or truncated file under the new name, and the only generation kept is unreadable)."""
    handle.flush()
    os.fsync(handle.fileno())


def _flush_directory(directory: Path) -> None:
    """The rename itself on disk (where the platform lets a directory be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class CheckpointTimer:
    """When a worker's next checkpoint is due: every ``every_s`` seconds of this run's training."""

    def __init__(self, every_s: float | None):
        self.every_s = every_s
        self._last = time.perf_counter()
        self.saved = 0

    def due(self) -> bool:
        return self.every_s is not None and time.perf_counter() - self._last >= self.every_s

    def mark(self) -> None:
        self._last = time.perf_counter()
        self.saved += 1
