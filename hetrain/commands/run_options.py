"""Command-line options shared by `hetrain train`, `compare` and `simulate`.

Run options are RunConfig's fields; protocol options come from the protocol
registry (:mod:`hetrain.registry`): every field of every protocol's options
class is a flag (``max_ig`` -> ``--max-ig``) whose default is None ("the
protocol's default"), so a flag is given exactly when the user typed it. A
flag given for a protocol that does not take it gets a warning, not silence.
"""

from __future__ import annotations

import argparse
import warnings

from hetrain.comm.settings import comm_fields, flag_of
from hetrain.config import DATA_SPLITS, OPTIMIZERS, WORKLOADS, RunConfig
from hetrain.errors import UsageError
from hetrain.registry import PROTOCOL_NAMES, all_option_fields, get_spec, protocols_using


def parse_protocols(text: str, flag: str) -> list[str]:
    """``hop,prague`` or ``all`` -> protocol names from the registry, each at most once, in the order given.

    ``flag`` is the option the text came from (``--protocols``, ``--protocol``), named in the error.
    """
    names = list(PROTOCOL_NAMES) if text.strip() == "all" else [p.strip() for p in text.split(",") if p.strip()]
    choices = f"choose from {', '.join(PROTOCOL_NAMES)} or all"
    if not names:
        raise UsageError(f"{flag} names no protocol; {choices}")
    unknown = [p for p in names if p not in PROTOCOL_NAMES]
    if unknown:
        raise UsageError(f"unknown protocol {unknown[0]!r} in {flag}; {choices}")
    twice = [p for i, p in enumerate(names) if p in names[:i]]
    if twice:
        raise UsageError(f"{flag} lists {twice[0]} twice; list each protocol once")
    return names


def add_run_options(parser: argparse.ArgumentParser, defaults: RunConfig) -> None:
    """What to train and when to stop (train, compare and simulate)."""
    g = parser.add_argument_group("workload")
    g.add_argument("--workers", type=int, default=defaults.num_workers, help="number of worker processes")
    g.add_argument("--workload", choices=WORKLOADS, default=defaults.workload,
                   help="mlp or cnn on scikit-learn's digits, synthetic (size set by --model-params), "
                        "or lm: a byte-level GPT (3.2M parameters) on Python's own documentation text")
    g.add_argument("--model-params", type=int, default=defaults.model_params,
                   help="parameters of the synthetic model (communication volume)")
    g.add_argument("--batch-size", type=int, default=defaults.batch_size)
    g.add_argument("--data-split", choices=DATA_SPLITS, default=defaults.data_split,
                   help="balanced (default): each worker samples its own slice of the training set, and a "
                        "worker faster than the mean also samples the slices of workers slower than it, so "
                        "every slice is trained at the same rate (in a job that may grow, --max-workers: each "
                        "epoch's batches are dealt out over the workers present, each batch to one); shard: "
                        "each worker its own slice only; "
                        "whole: every worker the whole set with its own seed (the simulator's math always "
                        "samples the whole set)")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default=defaults.optimizer,
                   help="default: sgd (momentum 0.9), adamw for lm")
    g.add_argument("--lr", type=float, default=defaults.lr, help="default: 0.1 for sgd, 0.001 for adamw")
    g.add_argument("--momentum", type=float, default=defaults.momentum, help="sgd momentum (default 0.9)")
    g.add_argument("--seed", type=int, default=defaults.seed)
    g.add_argument("--slowdown", default=defaults.slowdown,
                   help="none | I:Kx[,J:Lx] | every:N:Kx | random:p=P,factor=K | trace:FILE.csv")
    g.add_argument("--compute-ms", type=float, default=defaults.compute_ms,
                   help="emulated compute time per iteration in ms (the math still runs); 0: none, "
                        "the real compute time (slowed workers sleep (factor-1) x their math time)")
    stop = g.add_mutually_exclusive_group()
    stop.add_argument("--iterations", type=int, default=None, help="stop after K iterations")
    stop.add_argument("--time-budget", type=float, default=None, dest="time_budget_s",
                      help="stop after SECONDS of training")
    g.add_argument("--target-accuracy", type=float, default=defaults.target_accuracy,
                   help="time_to_target_s is to this test accuracy of the averaged model (default 0.95)")
    g.add_argument("--target-loss", type=float, default=defaults.target_loss,
                   help="lm: time_to_target_s is to this validation loss in nats/byte (default 2.5)")
    add_comm_options(parser, defaults)
    f = parser.add_argument_group("failures")
    f.add_argument("--fail", default=defaults.fail,
                   help="kill workers for real (SIGKILL): none | W@Ts[,V@Us] (e.g. 3@20s: on the training clock) | "
                        "W@wall:Ts (from the launch) | W@startup|connect|checkpoint|finish (as it enters the phase) | "
                        "any with :stop (SIGSTOP: a hang) | random:rate=R per minute")
    f.add_argument("--on-failure", choices=("abort", "continue", "respawn"), default=defaults.on_failure,
                   dest="on_failure",
                   help="when a worker dies: abort the job, continue with the survivors, or respawn (continue, "
                        "and a replacement joins; hop, dpsgd, prague, adpsgd, ps) (default: continue; abort for "
                        "allreduce)")


def add_comm_options(parser: argparse.ArgumentParser, defaults: RunConfig) -> None:
    """Local steps, outer optimizer, compression and the emulated network: one flag per field of
    :class:`~hetrain.comm.settings.CommSettings` (default None: the setting's own default)."""
    g = parser.add_argument_group("communication (every protocol but allreduce, unless said otherwise)")
    for setting in comm_fields():
        meta = setting.metadata
        g.add_argument(flag_of(setting), dest=setting.name, type=meta["type"], choices=meta["choices"],
                       metavar=meta["metavar"], default=defaults.comm.get(setting.name), help=meta["help"])


def comm_values(args: argparse.Namespace) -> dict:
    """The communication settings the user gave, by Python name."""
    return {f.name: getattr(args, f.name) for f in comm_fields() if getattr(args, f.name, None) is not None}


def add_runtime_options(parser: argparse.ArgumentParser, defaults: RunConfig) -> None:
    """Options of real runs only (train, compare)."""
    g = parser.add_argument_group("runtime")
    g.add_argument("--eval-interval", type=float, default=defaults.eval_interval_s, dest="eval_interval_s",
                   help="seconds between model snapshots for accuracy/loss over time (default 0.5; lm 5)")
    g.add_argument("--device", choices=("cpu", "cuda"), default=defaults.device,
                   help="cpu, or cuda (a GPU per worker under NCCL; with --backend gloo workers may share GPUs)")
    g.add_argument("--backend", choices=("nccl", "gloo"), default=defaults.backend,
                   help="the process group's backend (default: nccl for cuda, gloo for cpu); gloo with --device "
                        "cuda keeps the model on the GPU and moves messages through the host")
    g.add_argument("--timeout", type=float, default=defaults.timeout_s, dest="timeout_s",
                   help="seconds any blocking wait may last before the job fails")
    g.add_argument("--heartbeat-timeout", type=float, default=defaults.heartbeat_timeout_s,
                   dest="heartbeat_timeout_s",
                   help="seconds without a heartbeat after which a local worker is declared hung, killed and "
                        "handled as a death (default 30; 0: off)")
    g.add_argument("--log", default=",".join(defaults.log), metavar="KINDS",
                   help="where the figures over time go, comma-separated: csv (OUT/scalars.csv), tensorboard, "
                        "wandb (offline), mlflow (a file store in OUT), or none (default csv; docs/guides/logging.md)")
    m = parser.add_argument_group("members (workers that join and leave a running job)")
    m.add_argument("--max-workers", type=int, default=defaults.max_workers, metavar="M",
                   help="the job may grow to M workers while it trains (hop, dpsgd, prague, adpsgd, ps; default: "
                        "--workers, fixed); a worker sent SIGTERM leaves gracefully in any job")
    m.add_argument("--join", default=defaults.join, metavar="K@Ts",
                   help="start K new workers T seconds into training: none | K@Ts[,L@Us] (e.g. 4@8s; needs "
                        "--max-workers; each into a vacant rank, a rank whose worker left included; a join "
                        "that finds none waits for one; default none)")
    c = parser.add_argument_group("checkpoints")
    c.add_argument("--checkpoint-dir", default=None,
                   help="write each worker's model, optimizer, data position, RNG and protocol state here")
    c.add_argument("--checkpoint-every", type=float, default=None, dest="checkpoint_every_s", metavar="SECONDS",
                   help="checkpoint every SECONDS of training (default: only at the end)")
    c.add_argument("--resume", action="store_true",
                   help="continue from --checkpoint-dir's checkpoints (a fresh start when it holds none)")


def add_protocol_options(parser: argparse.ArgumentParser) -> None:
    """One flag per protocol option in the registry (default None: the protocol's own default)."""
    g = parser.add_argument_group("protocol options (each applies to the protocols its help names)")
    for name, field in all_option_fields().items():
        meta = field.metadata
        g.add_argument("--" + name.replace("_", "-"), dest=name, type=meta["type"], choices=meta["choices"],
                       default=None, help=meta["help"])


def protocol_values(args: argparse.Namespace) -> dict:
    """The protocol options the user gave, by Python name."""
    return {name: getattr(args, name) for name in all_option_fields() if getattr(args, name, None) is not None}


def warn_unused(values: dict, protocols: list[str], comm: dict | None = None) -> None:
    """A flag none of ``protocols`` takes would silently do nothing: say so (and of the communication
    settings ``comm``, ``--gossip-step`` without compression: it is compressed gossip's consensus step)."""
    if comm and comm.get("gossip_step") is not None:
        if comm.get("compression", "none") == "none":
            warnings.warn("--gossip-step is ignored: it is the consensus step of compressed gossip; add --compress",
                          stacklevel=2)
        elif "allreduce" in protocols:
            warnings.warn("--gossip-step is ignored by allreduce (no gossip: DDP's hooks compress the gradients)",
                          stacklevel=2)
    for name in values:
        takers = protocols_using(name)
        if not set(takers) & set(protocols):
            flag = "--" + name.replace("_", "-")
            warnings.warn(f"{flag} is ignored: {', '.join(protocols)} take(s) no such option "
                          f"(it applies to {', '.join(takers)})", stacklevel=2)


def config_from_args(args: argparse.Namespace, **overrides) -> RunConfig:
    protocol = overrides.pop("protocol", getattr(args, "protocol", "hop"))
    spec = get_spec(protocol)
    values = protocol_values(args)
    fields = dict(
        protocol=protocol, num_workers=args.workers, workload=args.workload,
        model_params=args.model_params, batch_size=args.batch_size, data_split=args.data_split,
        optimizer=args.optimizer, lr=args.lr,
        momentum=args.momentum, target_loss=args.target_loss,
        seed=args.seed, slowdown=args.slowdown, compute_ms=args.compute_ms, iterations=args.iterations,
        time_budget_s=args.time_budget_s, target_accuracy=args.target_accuracy,
        fail=args.fail, on_failure=args.on_failure,
        options={k: v for k, v in values.items() if k in spec.option_names()},
        comm=comm_values(args),
    )
    for name in ("eval_interval_s", "device", "backend", "timeout_s", "heartbeat_timeout_s", "checkpoint_dir",
                 "checkpoint_every_s", "resume", "max_workers", "join"):
        if hasattr(args, name):
            fields[name] = getattr(args, name)
    if hasattr(args, "log"):
        from hetrain.loggers.scalar_writers import parse_log_kinds

        fields["log"] = parse_log_kinds(args.log)
    fields.update(overrides)
    return RunConfig(**fields)
