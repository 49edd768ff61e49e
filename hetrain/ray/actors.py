"""The actors of one Ray job: start, look at, signal and kill them, by rank (as ``WorkerProcesses``).

:class:`RayWorkers` has the interface :class:`hetrain.jobs.local_job.LocalJob` uses of
:class:`hetrain.jobs.workers.WorkerProcesses`, so the local launcher's watch loop (deaths, respawn,
heartbeats, faults, the start gate, the end) runs a Ray job unchanged. What differs:

* workers are actors placed on the bundles of one placement group (``SPREAD``: over as many nodes as
  the cluster has; one bundle per rank, of ``--ray-worker-resources``). A bundle on a node that died
  is placed again by Ray where there is capacity; a replacement (``respawn``) is started on its
  rank's bundle, so it runs once there is room for it anywhere, and waits until then;
* a job that may grow (``start_workers`` below the world size) places only its starting ranks so (one
  group, all or nothing, as a fixed job); each vacant rank gets a placement group of its own, of one
  bundle, asked for at once and left pending until the cluster has room for it: :meth:`placed_vacant`
  says which are placed, and the job starts a worker into them (docs/decisions/ray-jobs-grow-and-drain.md);
* a worker's "process" is its actor's ``run`` call: its result (or error) is the call's return, and
  its death is the call failing with Ray's ``RayActorError`` (the actor or its node died; Ray's own
  reason is kept for the record). ``pid(rank)`` is ``(rank, incarnation)``: a key per process;
* SIGKILL is ``ray.kill``; other signals are sent by the actor to itself (``--fail ...:stop``);
* the actors run at the normal CPU priority: Ray starts its workers at niceness 15, under which a
  worker on a busy node took 74 s, not 4 s, to import torch (docs/decisions/ray-workers-at-normal-priority.md).
"""

from __future__ import annotations

import dataclasses
import queue
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hetrain.errors import WorkerError
from hetrain.jobs.worker_process import WorkerSpec
from hetrain.ray.channels import DriverChannels
from hetrain.ray.driver_store import DriverStore
from hetrain.ray.worker_actor import WorkerActor
from hetrain.transport.job_secret import new_secret

# Ray's own setting, per worker process, as its job supervisor sets it for a job's driver: the
# training worker is the job, not a background task to yield to whatever else the node runs
WORKER_RUNTIME_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}
KILLED = -9  # the exit code an actor that died (killed, or its node lost) reads as


@dataclasses.dataclass(frozen=True)
class RayPlacement:
    """Where a Ray job's workers go: ``resources`` per worker (a placement-group bundle, e.g.
    ``{"CPU": 1, "GPU": 1}``), the driver's address the actors reach it by, the environment the
    actors take (besides their own), and how long the placement group may take to be placed."""

    resources: dict
    host: str
    env: dict
    placement_timeout_s: float = 60.0


class RayWorkers:
    def __init__(self, template: WorkerSpec, placement: RayPlacement, start_workers: int | None = None):
        self.template = template
        self.placement = placement
        n = template.world_size
        start = n if start_workers is None else start_workers
        self.server = DriverStore(placement.host, template.timeout_s)
        self._results: queue.Queue = queue.Queue()
        self.secret = new_secret()  # to the actors in their Ray call (run's argument), never through the store
        self.channels = DriverChannels(self.server.store, n, _Results(self), self.secret)
        self.payload = ray.put((template.fn, template.args))
        self.actor_class = ray.remote(WorkerActor)
        self.actors: list = [None] * n
        self.refs: list = [None] * n
        self.codes: list[int | None] = [None] * n
        self.reasons: list[str | None] = [None] * n
        self.incarnations = [0] * n
        self.where: dict[tuple[int, int], object] = {}  # (rank, incarnation) -> its actor's where() call
        self.pings: dict[tuple[int, int], tuple[object, float]] = {}  # -> the last ping's call, when sent
        self.nodes: dict[tuple[int, int], str] = {}  # (rank, incarnation) -> the node its actor runs on, once known
        self.group = placement_group([dict(placement.resources)] * start, strategy="SPREAD")
        try:
            ray.get(self.group.ready(), timeout=placement.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self.group)
            raise WorkerError(f"the Ray cluster could not place {start} workers of {placement.resources} within "
                              f"{placement.placement_timeout_s:.0f} s (ray status shows its free resources); "
                              "use fewer --workers or smaller --ray-worker-resources") from None
        # each vacant rank's own group, pending until the cluster has room (asked for once the start is placed,
        # so that none takes the room of a starting rank); with its ready() call, watched by placed_vacant
        self.vacant_groups: dict = {}
        try:
            for rank in range(start, n):
                self.vacant_groups[rank] = placement_group([dict(placement.resources)])
            self._vacant_ready = {rank: group.ready() for rank, group in self.vacant_groups.items()}
        except BaseException:
            self._remove_groups()
            raise

    @property
    def size(self) -> int:
        return self.template.world_size

    def start(self, rank: int, incarnation: int = 0, clock_offset_s: float = 0.0, start_iteration: int = 0,
              hold_phases: tuple = ()) -> None:
        spec = dataclasses.replace(self.template, fn=None, args=(), rank=rank, incarnation=incarnation,
                                   clock_offset_s=clock_offset_s, start_iteration=start_iteration,
                                   env={}, launched_at=time.time(), hold_phases=tuple(hold_phases))
        group, bundle = self._bundle_of(rank)
        actor = self.actor_class.options(
            **actor_resources(self.placement.resources), max_restarts=0, max_concurrency=2,
            runtime_env=WORKER_RUNTIME_ENV,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle),
        ).remote(self.placement.env)
        self.actors[rank], self.codes[rank], self.reasons[rank] = actor, None, None
        self.incarnations[rank] = incarnation
        self.refs[rank] = actor.run.remote(spec, self.server.address, self.secret, self.payload)
        self.where[(rank, incarnation)] = actor.where.remote()

    def _bundle_of(self, rank: int):
        """(placement group, bundle index) where ``rank``'s actors go."""
        if rank in self.vacant_groups:
            return self.vacant_groups[rank], 0
        return self.group, rank

    def renew_vacancy(self, rank: int) -> bool:
        """``rank``'s worker left: ask for a new placement group of its own (pending until the cluster has room;
        its old one, on a node maybe being drained, is removed) so that a later worker can join into it. False
        for a starting rank: its bundle is one of the starting group's, which is freed only with the job."""
        if rank not in self.vacant_groups:
            return False
        try:
            remove_placement_group(self.vacant_groups[rank])
        except Exception:  # noqa: BLE001 - its node is gone already
            pass
        self.vacant_groups[rank] = placement_group([dict(self.placement.resources)])
        self._vacant_ready[rank] = self.vacant_groups[rank].ready()
        return True

    def placed_vacant(self, ranks) -> list[int]:
        """Of the vacant ``ranks``, those whose placement group the cluster has placed (room for a worker)."""
        refs = {self._vacant_ready[rank]: rank for rank in ranks if rank in self._vacant_ready}
        if not refs:
            return []
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0, fetch_local=False)
        return sorted(refs[ref] for ref in ready)

    def node_of(self, rank: int) -> str | None:
        """The node ``rank``'s current actor runs on (None until its ``where`` call answered)."""
        key = self.pid(rank)
        if key not in self.nodes and self.running(rank):
            try:
                self.nodes[key] = ray.get(self.where[key], timeout=1)["node"]
            except ray.exceptions.RayError:
                return None
        return self.nodes.get(key)

    def ask_to_leave(self, rank: int) -> None:
        """Ask ``rank``'s actor to leave the job at its next step (its node is draining)."""
        self.actors[rank].ask_to_leave.remote()

    def pid(self, rank: int):
        return (rank, self.incarnations[rank])

    def running(self, rank: int) -> bool:
        """Whether ``rank``'s current actor has started (its ``where`` call returned): it is placed and runs."""
        ref = self.where.get((rank, self.incarnations[rank]))
        return ref is not None and bool(ray.wait([ref], timeout=0, fetch_local=False)[0])

    def answered_ping(self, rank: int, every_s: float) -> bool:
        """Whether ``rank``'s current actor answered the last ping (its ``where``, on the actor's second
        thread); a new one goes once that one is answered, at most one every ``every_s``. An actor whose
        process runs answers while its payload still imports (before its first heartbeat); a stopped or
        frozen one does not."""
        key = self.pid(rank)
        ref, sent_at = self.pings.get(key, (None, -float("inf")))
        if ref is not None and not ray.wait([ref], timeout=0, fetch_local=False)[0]:
            return False
        if time.monotonic() - sent_at >= every_s:
            self.pings[key] = (self.actors[rank].where.remote(), time.monotonic())
        return ref is not None

    def exitcode(self, rank: int) -> int | None:
        return self.codes[rank]

    def alive(self, rank: int) -> bool:
        return self.actors[rank] is not None and self.codes[rank] is None

    def reason(self, rank: int) -> str | None:
        """Ray's words for the death of ``rank``'s current actor (None: it did not die)."""
        return self.reasons[rank]

    def kill(self, rank: int) -> None:
        ray.kill(self.actors[rank], no_restart=True)

    def signal(self, rank: int, signum: int) -> None:
        import signal

        if signum == signal.SIGKILL:
            self.kill(rank)
        else:
            self.actors[rank].signal_self.remote(int(signum))

    def exited(self, ranks) -> bool:
        self.poll(0.0)
        return all(self.codes[r] is not None for r in ranks)

    def join(self, timeout_s: float) -> None:
        """The actors return when they finish; they are ended by :meth:`kill_all`."""

    def poll(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` for a worker's call to return; record every one that has (result or death)."""
        pending = {ref: rank for rank, ref in enumerate(self.refs) if ref is not None and self.codes[rank] is None}
        if not pending:
            time.sleep(wait_s)
            return
        ready, rest = ray.wait(list(pending), num_returns=1, timeout=wait_s, fetch_local=False)
        if ready and rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0, fetch_local=False)
            ready += more
        for ref in ready:
            self._settle(pending[ref], ref)

    def _settle(self, rank: int, ref) -> None:
        try:
            kind, value, detail = ray.get(ref, timeout=self.template.timeout_s)
        except ray.exceptions.RayActorError as error:
            self.codes[rank], self.reasons[rank] = KILLED, _reason(error)
            return
        except ray.exceptions.RayError as error:  # the call could not run (e.g. unpicklable arguments)
            kind, value, detail = "error", f"worker {rank}'s Ray call failed: {_reason(error)}", str(error)
        self.codes[rank] = 0 if kind == "ok" else 1
        self._results.put((rank, kind, value, detail))

    def placements(self) -> dict:
        """(rank, incarnation) -> {node, pid, niceness} for each actor that started (the others are left out)."""
        found = {}
        for key, ref in self.where.items():
            ready, _ = ray.wait([ref], timeout=0)
            if ready:
                try:
                    found[key] = ray.get(ref, timeout=1)
                except ray.exceptions.RayError:
                    pass
        return found

    def kill_all(self) -> None:
        """End every actor and free the placement groups and the store (the job is over, one way or another)."""
        for actor in self.actors:
            if actor is not None:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        self._remove_groups()
        self.server.close()

    def _remove_groups(self) -> None:
        for group in [self.group, *self.vacant_groups.values()]:
            try:
                remove_placement_group(group)
            except Exception:  # noqa: BLE001 - Ray is shutting down
                pass


def actor_resources(bundle: dict) -> dict:
    """A bundle ({"CPU": 1, "GPU": 1, "A100": 1, "memory": ...}) as actor options."""
    rest = dict(bundle)
    options = {"num_cpus": rest.pop("CPU", 0), "num_gpus": rest.pop("GPU", 0)}
    if "memory" in rest:
        options["memory"] = rest.pop("memory")
    options["resources"] = rest
    return options


class _Results:
    """``JobChannels.results`` for a Ray job: ``get(timeout)`` polls the actors' calls."""

    def __init__(self, workers: RayWorkers):
        self._workers = workers

    def get(self, timeout: float):
        try:
            return self._workers._results.get_nowait()
        except queue.Empty:
            pass
        self._workers.poll(timeout)
        return self._workers._results.get_nowait()

    def get_nowait(self):
        """What the last poll settled and is not taken yet (queue.Empty when nothing)."""
        return self._workers._results.get_nowait()


def _reason(error: Exception) -> str:
    """The line of Ray's error that says why (e.g. "The actor died because its node has died.")."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if "because" in line or "killed" in line:
            return line
    return lines[0] if lines else type(error).__name__
