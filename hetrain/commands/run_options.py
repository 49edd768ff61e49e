"""Command-line options shared by `hetrain train`, `compare` and (in part) `simulate`."""

from __future__ import annotations

import argparse

from hetrain.config import GG_MODES, OPTIMIZERS, WORKLOADS, RunConfig


def add_workload_options(parser: argparse.ArgumentParser, defaults: RunConfig) -> None:
    g = parser.add_argument_group("workload")
    g.add_argument("--workers", type=int, default=defaults.num_workers, help="number of worker processes")
    g.add_argument("--workload", choices=WORKLOADS, default=defaults.workload,
                   help="mlp or cnn on scikit-learn's digits, synthetic (size set by --model-params), "
                        "or lm: a byte-level GPT (3.2M parameters) on Python's own documentation text")
    g.add_argument("--model-params", type=int, default=defaults.model_params,
                   help="parameters of the synthetic model (communication volume)")
    g.add_argument("--batch-size", type=int, default=defaults.batch_size)
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
    g.add_argument("--eval-interval", type=float, default=defaults.eval_interval_s, dest="eval_interval_s",
                   help="seconds between model snapshots for accuracy/loss over time (default 0.5; lm 5)")
    g.add_argument("--device", choices=("cpu", "cuda"), default=defaults.device,
                   help="cpu (gloo) or cuda (NCCL)")
    g.add_argument("--timeout", type=float, default=defaults.timeout_s, dest="timeout_s",
                   help="seconds any blocking wait may last before the job fails")


def add_protocol_options(parser: argparse.ArgumentParser, defaults: RunConfig) -> None:
    g = parser.add_argument_group("decentralized protocols (dpsgd, hop)")
    g.add_argument("--topology", default=defaults.topology,
                   help="ring, double_ring, torus, hypercube, exponential, complete, or an edge-list file")
    g.add_argument("--backup", type=int, default=defaults.backup, help="Hop: backup workers b")
    g.add_argument("--staleness", type=int, default=defaults.staleness,
                   help="Hop: bounded staleness s (also ps: asynchronous staleness)")
    g.add_argument("--max-ig", type=int, default=defaults.max_ig, help="Hop: tokens per edge (max iteration gap)")
    g.add_argument("--skip-threshold", type=int, default=defaults.skip_threshold,
                   help="Hop: skip iterations when in-neighbours are this far ahead")
    p = parser.add_argument_group("prague")
    p.add_argument("--gg", choices=GG_MODES, default=defaults.gg, help="Group Generator mode")
    p.add_argument("--group-size", type=int, default=defaults.group_size, help="P-Reduce group size s")
    p.add_argument("--communicator-cache", type=int, default=defaults.communicator_cache,
                   help="communicators kept per worker")
    p.add_argument("--workers-per-node", type=int, default=defaults.workers_per_node,
                   help="node size for the node-aware static schedule")


def config_from_args(args: argparse.Namespace, **overrides) -> RunConfig:
    fields = dict(
        protocol=getattr(args, "protocol", "hop"), num_workers=args.workers, workload=args.workload,
        model_params=args.model_params, batch_size=args.batch_size, optimizer=args.optimizer, lr=args.lr,
        momentum=args.momentum, target_loss=args.target_loss,
        seed=args.seed, slowdown=args.slowdown, compute_ms=args.compute_ms, iterations=args.iterations,
        time_budget_s=args.time_budget_s, target_accuracy=args.target_accuracy,
        eval_interval_s=args.eval_interval_s, device=args.device, timeout_s=args.timeout_s,
        topology=args.topology, backup=args.backup, staleness=args.staleness, max_ig=args.max_ig,
        skip_threshold=args.skip_threshold, gg=args.gg, group_size=args.group_size,
        communicator_cache=args.communicator_cache, workers_per_node=args.workers_per_node,
    )
    fields.update(overrides)
    return RunConfig(**fields)
