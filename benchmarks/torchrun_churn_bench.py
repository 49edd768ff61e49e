"""torchrun under node churn: issue 41's schedule with ``--max-restarts --resume``, against no churn.

    .venv/bin/python benchmarks/torchrun_churn_bench.py --out runs/torchrun-churn        # 300 s, a loss every 60 s
    .venv/bin/python benchmarks/torchrun_churn_bench.py --out runs/tr --seconds 90 --period 45 --back-after 15

The torchrun side of ``benchmarks/ray_bench.py --mode churn``, on this one machine. A node is one
torchrun agent (``torch.distributed.run --nnodes 3 --nproc-per-node 2 --max-restarts N``, c10d
rendezvous) started in a session of its own; its 2 ranks each run ``benchmarks/torchrun_churn_rank.py``:
``hetrain train --protocol hop --workers 6 --compute-ms 50 --slowdown 0:3x --checkpoint-dir DIR
--checkpoint-every C --resume --log none --no-progress --out OUT --timeout T`` with ``--time-budget`` =
the time left to the job's deadline (launch + ``--seconds``), the same absolute deadline for every attempt.

* The rendezvous store is a ``TCPStore`` hosted by this process (every agent ``is_host=false``), so no
  node's loss takes it down. The agents run with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (unless
  ``--share-store``): then each rendezvous round's rank-0 agent picks a fresh port and the ranks' rank 0
  hosts their store. torch's default (the rank-0 agent's own store shared with the ranks) cannot take a
  fresh node in torch 2.13: every agent keeps the store's address from its first round, so a fresh agent
  waits for ``MASTER_ADDR`` in the new round's keys, which no survivor writes, until the rendezvous fails
  (the survivors of a lost rank-0 agent also keep its dead address).
* A node's loss: SIGKILL of its agent's process group and of its ranks' (torchrun starts each rank in a
  session of its own); every ``--period`` s of the job's wall time the agent holding rank 0 is lost (as Ray's
  churn loses the node holding the lowest live rank; between attempts, when no rank runs, the agent
  with the lowest pid, which the rendezvous makes group rank 0; ``--lose last-rank``: the one holding
  the last rank), and a fresh agent is started ``--back-after`` s later; no loss at or after
  ``--seconds``. ``--nnodes 3`` (static): the survivors' restart waits for the third node (a checkpoint
  of 6 workers cannot resume with 4: hetrain refuses another ``num_workers``, exit 2, so elastic
  ``--nnodes 2:3`` would fail every resume).
* Each attempt's budget counts its training, from the end of its start-up: the last attempt's training
  ends about one rank start-up after the deadline (the failure-free job's too).
* The survivors notice a loss by gloo's connection reset (the kernel closes a killed process's sockets):
  their ranks fail within 0.1 s and their agents restart them. ``--timeout`` (hetrain's, 60 s as in Ray's
  churn job) bounds only the waits where no reset comes: a machine that vanished from the network would be
  noticed after it, which this emulation (as Ray's) does not show.
* Then the same job with no churn (same agents, same deadline rule).

Figures (OUT/torchrun_churn.json):

* goodput = counted samples / seconds from launching the first agent to the last agent's exit
  (start-ups, restarts, the waits for the node to return, evaluation and exits included). Counted
  samples = the iterations the final model holds x batch: per rank, the final attempt's computed
  iterations plus, back along the checkpoints each attempt resumed from, what the attempt that wrote
  the checkpoint had computed by then (:func:`preserved_iterations`). The iterations since a rank's last
  checkpoint before a loss are computed again and counted once; nothing else is discounted (Ray's figure
  counts every computed iteration, the dead workers' included, minus one per death). Beside it,
  ``goodput_by_final_iteration``: the sum of the ranks' final ``iteration`` x batch, which counts more
  than was computed: Hop's slow worker skips iterations to keep up (its ``iteration`` jumps).
* per loss: ``detect_s`` (kill -> the first survivor rank fails or is stopped by its agent),
  ``restart_s`` (kill -> every rank of the attempt that then ran has computed its first iteration),
  ``after_return_s`` (the fresh agent started -> that moment; ``ranks_started_after_return_s``: -> the
  last rank of that attempt ran this script, torch imported), the job attempts started in between
  (a rank 0 started) and the agents' restart counts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RANK_SCRIPT = ROOT / "benchmarks" / "torchrun_churn_rank.py"
TAG = "HETRAIN_CHURN_TAG"  # in every agent's and rank's environment: the sweep at the end finds them by it


# ----- processes --------------------------------------------------------------------------------------
def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
    except OSError:
        return {}


def tagged_pids(tag: str) -> list[int]:
    """The processes whose environment holds ``TAG=tag`` (agents, ranks), this one excepted."""
    if not os.path.isdir("/proc"):
        return []
    return [int(e) for e in os.listdir("/proc")
            if e.isdigit() and int(e) != os.getpid() and _environ(int(e)).get(TAG.encode()) == tag.encode()]


def rank_pids_of(agent_pid: int) -> dict[int, int]:
    from hetrain.testing.processes import torchrun_rank_pids

    return torchrun_rank_pids(agent_pid)


def kill_node(agent: subprocess.Popen) -> list[int]:
    """SIGKILL an agent's process group and its ranks' (each in a session of its own); the ranks killed."""
    ranks = rank_pids_of(agent.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(agent.pid, signal.SIGKILL)
    for pid in ranks.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    return sorted(ranks)


def sweep(tag: str, agents: list[subprocess.Popen]) -> int:
    """Kill every process of this run (agents' groups, then anything tagged); reap the agents."""
    for agent in agents:
        if agent.poll() is None:
            kill_node(agent)
    left = tagged_pids(tag)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for agent in agents:
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(timeout=10)
    return len(left)


# ----- one job ----------------------------------------------------------------------------------------
class Job:
    """A torchrun job of ``--nodes`` agents on this machine, its store in this process."""

    def __init__(self, args, directory: Path, store_port: int, deadline: float):
        self.args, self.dir = args, directory
        self.run_id = f"churn-{uuid.uuid4().hex[:8]}"
        self.tag = self.run_id
        self.events = directory / "events.jsonl"
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                        OMP_NUM_THREADS="1", HETRAIN_CHURN_DEADLINE=repr(deadline),
                        HETRAIN_CHURN_EVENTS=str(self.events), **{TAG: self.tag})
        if not args.share_store:
            self.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        self.command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", str(args.nodes),
            "--nproc-per-node", str(args.workers_per_node), "--max-restarts", str(args.max_restarts),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{store_port}", "--rdzv-id", self.run_id,
            "--rdzv-conf", "is_host=false", "--local-addr", "127.0.0.1", str(RANK_SCRIPT),
            *hetrain_args(args, directory)]
        self.agents: list[subprocess.Popen] = []
        self.logs: list = []

    def start_agent(self) -> subprocess.Popen:
        log = open(self.dir / f"agent-{len(self.agents)}.log", "w")  # noqa: SIM115 (closed in close())
        self.logs.append(log)
        agent = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        self.agents.append(agent)
        return agent

    def live(self) -> list[subprocess.Popen]:
        return [a for a in self.agents if a.poll() is None]

    def holder_of(self, rank: int) -> tuple[subprocess.Popen | None, str]:
        """The live agent running ``rank`` now; between attempts (no rank runs), the agent the rendezvous
        will give that rank: it orders agents by address, then pid (rank 0: the lowest pid)."""
        live = self.live()
        for agent in live:
            if rank in rank_pids_of(agent.pid):
                return agent, f"holds rank {rank}"
        if not live:
            return None, "none live"
        return (min(live, key=lambda a: a.pid), "lowest pid (no rank running)") if rank == 0 else \
            (max(live, key=lambda a: a.pid), "highest pid (no rank running)")

    def close(self) -> int:
        left = sweep(self.tag, self.agents)
        for log in self.logs:
            log.close()
        return left


def hetrain_args(args, directory: Path) -> list[str]:
    return ["--protocol", args.protocol, "--workers", str(args.nodes * args.workers_per_node),
            "--compute-ms", str(args.compute_ms), "--slowdown", args.slowdown, "--timeout", str(args.timeout),
            "--checkpoint-dir", str(directory / "ckpt"), "--checkpoint-every", str(args.checkpoint_every),
            "--resume", "--no-progress", "--out", str(directory / "run")]  # the rank script adds --log none


def run_job(args, name: str, churned: bool, store_port: int, out: Path) -> dict:
    directory = out / name
    directory.mkdir(parents=True, exist_ok=False)
    launched = time.time()
    deadline = launched + args.seconds
    job = Job(args, directory, store_port, deadline)
    losses: list[dict] = []
    pending: dict | None = None
    ended_at = None
    try:
        for _ in range(args.nodes):
            job.start_agent()
        give_up = deadline + args.grace
        while time.time() < give_up:
            now = time.time() - launched
            if churned and pending is None and (len(losses) + 1) * args.period <= now \
                    and (len(losses) + 1) * args.period < args.seconds:
                victim, why = job.holder_of(0 if args.lose == "rank0" else args.nodes * args.workers_per_node - 1)
                if victim is not None:
                    at = time.time()
                    ranks = kill_node(victim)
                    victim.wait(timeout=10)
                    pending = {"at": at, "agent": victim.pid, "chosen": why, "ranks": ranks, "back_at": None}
                    losses.append(pending)
                    print(f"[{name}] {at - launched:6.1f} s: node lost (agent {victim.pid}, ranks {ranks}, {why})",
                          flush=True)
            if pending is not None and time.time() >= pending["at"] + args.back_after:
                agent = job.start_agent()
                pending["back_at"] = time.time()
                pending["back_agent"] = agent.pid
                print(f"[{name}] {pending['back_at'] - launched:6.1f} s: node added (agent {agent.pid})", flush=True)
                pending = None
            if not job.live() and pending is None:
                ended_at = time.time()
                break
            time.sleep(0.05)
    finally:
        left = job.close()
    whole_s = (ended_at or time.time()) - launched
    codes = [a.returncode for a in job.agents]
    row = {"whole_job_s": whole_s, "finished": ended_at is not None, "agent_exit_codes": codes,
           "processes_swept": left, "run_id": job.run_id}
    events = read_events(job.events)
    row.update(count_samples(directory, events))
    if row.get("counted_samples") is not None:
        row["goodput"] = row["counted_samples"] / whole_s
        row["goodput_by_final_iteration"] = row["iteration_samples"] / whole_s
    row.update(attempts(events, losses, launched, deadline + args.grace))
    return row


def count_samples(directory: Path, events: list[dict]) -> dict:
    """Counted samples: the iterations the final model holds (:func:`preserved_iterations`) x batch, from
    the final attempt's metrics.json and the ranks' events; beside them the final ``iteration``s (also
    read back from the final checkpoints)."""
    import torch

    row: dict = {"counted_samples": None}
    metrics_file = directory / "run" / "metrics.json"
    checkpointed = {}
    for file in sorted((directory / "ckpt").glob("worker-*.pt")):
        state = torch.load(file, map_location="cpu", weights_only=True)
        checkpointed[int(state["rank"])] = int(state["protocol"]["iteration"])
    row["checkpoint_iteration"] = checkpointed
    if not metrics_file.exists():
        return row
    metrics = json.loads(metrics_file.read_text())
    batch = metrics["config"]["batch_size"]
    iteration = {w["rank"]: w["iteration"] for w in metrics["workers"]}
    preserved, checks = preserved_iterations(events, metrics)
    row.update(batch_size=batch, preserved_iterations=preserved, lineage_checks=checks,
               final_iteration=iteration, iteration_samples=sum(iteration.values()) * batch,
               checkpoints_match_metrics=checkpointed == iteration, final_attempt_resumed=metrics.get("resumed"),
               iterations_final_attempt=metrics["total_iterations"],
               final_attempt_samples_per_s=metrics["samples_per_s"], final_attempt_training_s=metrics["wall_time_s"],
               final_attempt_startup_s=metrics.get("startup_s"), final_accuracy=metrics["final_accuracy_avg_model"])
    if all(v is not None for v in preserved.values()):
        row["counted_samples"] = sum(preserved.values()) * batch
    return row


def preserved_iterations(events: list[dict], metrics: dict) -> tuple[dict, list[str]]:
    """Per rank, the iterations it computed that the final model holds: the final attempt's, plus, back
    along the checkpoints each attempt resumed from, the iterations the attempt that wrote that checkpoint
    had computed when it wrote it (``iterations`` in the file). Work after a rank's last checkpoint before a
    loss is not held: it is computed again and counted once.

    Each rank's ``start`` event holds the checkpoint it found (mtime, ``iterations``); its writer is that
    rank's latest attempt started before the file's mtime (a rank's attempts never overlap: torchrun stops
    every rank before the next rendezvous). An attempt resumed when every rank's file was there (hetrain's
    rule), else it started afresh and the chain ends. Also returns what did not check out."""
    starts: dict[int, list[dict]] = {}
    for e in events:
        if e["event"] == "start":
            starts.setdefault(e["rank"], []).append(e)
    world = len(metrics["workers"])
    preserved, problems = {}, []
    for worker in metrics["workers"]:
        rank, chain = worker["rank"], starts.get(worker["rank"], [])
        if not chain:
            preserved[rank] = None
            problems.append(f"rank {rank}: no start event")
            continue
        total, current = worker["iterations"], chain[-1]
        link = current.get("checkpoint") if metrics.get("resumed") else None
        if link is not None and "error" in link:
            problems.append(f"rank {rank}: its final attempt could not read its checkpoint: {link['error']}")
            link = None
        if link is not None and worker.get("iterations_before_resume") != link["iterations"]:
            problems.append(f"rank {rank}: the final attempt resumed from {worker.get('iterations_before_resume')} "
                            f"iterations, its start event saw {link['iterations']}")
        while link is not None and link["files_present"] == world:
            writers = [e for e in chain if e["t"] < link["mtime"] and e["t"] < current["t"]]
            if not writers:
                problems.append(f"rank {rank}: no attempt wrote the checkpoint of {link['mtime']}")
                break
            total += link["iterations"]
            current = writers[-1]
            link = current.get("checkpoint")
            if link is not None and "error" in link:
                problems.append(f"rank {rank}: an attempt could not read its checkpoint: {link['error']}")
                break
        preserved[rank] = total
    return preserved, problems


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return sorted((json.loads(line) for line in path.read_text().splitlines() if line.strip()), key=lambda e: e["t"])


def attempts(events: list[dict], losses: list[dict], launched: float, end: float) -> dict:
    """Per loss, from the ranks' events: detection, restart and the attempts started in between."""
    starts0 = [e for e in events if e["event"] == "start" and e["rank"] == 0]
    restarts: dict[int, int] = {}
    for e in events:
        restarts[e["agent"]] = max(restarts.get(e["agent"], 0), e["restart"])
    first = _attempt_times(events, launched, losses[0]["at"] if losses else end)
    row = {"job_attempts": len(starts0), "agent_restarts": restarts,
           "startup_s": first[1] - launched if first else None}
    for index, loss in enumerate(losses):
        window_end = losses[index + 1]["at"] if index + 1 < len(losses) else end
        survivors = [e for e in events if e["agent"] != loss["agent"] and loss["at"] <= e["t"] < window_end]
        failed = [e for e in survivors if e["event"] == "sigterm" or (e["event"] == "exit" and e.get("code") != 0)]
        loss["detect_s"] = failed[0]["t"] - loss["at"] if failed else None
        loss["detected_by"] = (failed[0].get("error") or f"{failed[0]['event']} (code {failed[0].get('code')})"
                               if failed else None)
        loss["job_attempts"] = sum(1 for e in starts0 if loss["at"] <= e["t"] < window_end)
        times = _attempt_times(events, loss["at"], window_end)
        back = loss.get("back_at")
        loss["restart_s"] = times[1] - loss["at"] if times else None
        loss["after_return_s"] = times[1] - back if times and back else None
        loss["ranks_started_after_return_s"] = times[0] - back if times and back else None
        loss["at"] = round(loss["at"] - launched, 3)
        loss["back_at"] = round(back - launched, 3) if back else None
    row["losses"] = losses
    return row


def _attempt_times(events: list[dict], begin: float, end: float) -> tuple[float, float] | None:
    """For the last attempt started in [begin, end) (each rank's last start there): when its last rank
    started (this script's ``start`` event: torch imported, the checkpoint read) and when every one of its
    ranks had computed its first iteration (``time.time()``); None if some rank never got there."""
    ranks = {e["rank"] for e in events if e["event"] == "start"}
    last_start = {}
    for e in events:
        if e["event"] == "start" and begin <= e["t"] < end:
            last_start[e["rank"]] = e
    if not ranks or set(last_start) != ranks:
        return None
    trained = {e["pid"]: e["t"] for e in events if e["event"] == "training"}
    if not all(e["pid"] in trained for e in last_start.values()):
        return None
    return max(e["t"] for e in last_start.values()), max(trained[e["pid"]] for e in last_start.values())


# ----- the comparison ---------------------------------------------------------------------------------
def summary(record: dict) -> str:
    lines = []
    for name in ("with_churn", "failure_free"):
        row = record.get(name)
        if row is None:
            continue
        goodput = f"{row['goodput']:.0f} samples/s" if row.get("goodput") else "n/a"
        lines.append(f"{name}: whole job {row['whole_job_s']:.1f} s, counted samples {row.get('counted_samples')}, "
                     f"goodput {goodput}, job attempts {row['job_attempts']}, agents' exit codes "
                     f"{row['agent_exit_codes']}, start-up {_s(row['startup_s'])}")
        for loss in row.get("losses", []):
            lines.append(f"  loss at {loss['at']:.1f} s (ranks {loss['ranks']}): detected {_s(loss['detect_s'])}, "
                         f"every rank training again {_s(loss['restart_s'])} after the kill, "
                         f"{_s(loss['after_return_s'])} after the node's return (its ranks started after "
                         f"{_s(loss['ranks_started_after_return_s'])}); {loss['job_attempts']} attempt(s)")
    if record.get("goodput_vs_failure_free") is not None:
        lines.append(f"goodput with churn / failure-free: {record['goodput_vs_failure_free']:.3f}")
    return "\n".join(lines)


def _s(value) -> str:
    return f"{value:.2f} s" if value is not None else "n/a"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for torchrun_churn.json (and each job's files)")
    parser.add_argument("--mode", choices=("both", "churn", "free"), default="both")
    parser.add_argument("--protocol", default="hop")
    parser.add_argument("--compute-ms", type=float, default=50.0, help="emulated compute per iteration (ms)")
    parser.add_argument("--slowdown", default="0:3x", help="as hetrain train's (default: rank 0 three times slower)")
    parser.add_argument("--nodes", type=int, default=3, help="torchrun agents (--nnodes)")
    parser.add_argument("--workers-per-node", type=int, default=2, help="--nproc-per-node")
    parser.add_argument("--seconds", type=float, default=300.0, help="the job's deadline, from the first launch")
    parser.add_argument("--period", type=float, default=60.0, help="a node lost every PERIOD s of the job's wall time")
    parser.add_argument("--back-after", type=float, default=30.0, help="a fresh node started this long after")
    parser.add_argument("--checkpoint-every", type=float, default=10.0, help="hetrain's --checkpoint-every (s)")
    parser.add_argument("--timeout", type=float, default=60.0, help="hetrain's --timeout (s), as Ray's churn job")
    parser.add_argument("--max-restarts", type=int, default=10, help="torchrun's --max-restarts (per agent)")
    parser.add_argument("--grace", type=float, default=180.0, help="the job is killed this long after its deadline")
    parser.add_argument("--lose", choices=("rank0", "last-rank"), default="rank0",
                        help="the node lost: the one holding rank 0 (as Ray's churn) or the last rank")
    parser.add_argument("--share-store", action="store_true",
                        help="torch's default: the rank-0 agent's store shared with the ranks (see above)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # as Ctrl-C: every agent and rank killed on the way out
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # outlives every node
    record = {"args": vars(args), "cpus": os.cpu_count(), "store_port": store.port}
    try:
        if args.mode in ("both", "churn"):
            record["with_churn"] = run_job(args, "with_churn", True, store.port, out)
            if args.mode == "both":
                print(summary(record), flush=True)
        if args.mode in ("both", "free"):
            record["failure_free"] = run_job(args, "failure_free", False, store.port, out)
        churn, free = record.get("with_churn", {}), record.get("failure_free", {})
        if churn.get("goodput") and free.get("goodput"):
            record["goodput_vs_failure_free"] = churn["goodput"] / free["goodput"]
    finally:
        (out / "torchrun_churn.json").write_text(json.dumps(record, indent=1) + "\n")
    print(summary(record))
    print(f"wrote {out / 'torchrun_churn.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
