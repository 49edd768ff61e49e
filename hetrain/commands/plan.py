"""``hetrain plan``: partition a model's layers over a (heterogeneous) accelerator array."""

from __future__ import annotations

import argparse

from hetrain.errors import UsageError

HELP = "plan per-layer tensor partitioning (HyPar/AccPar) for a model on an accelerator array"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="zoo name (alexnet, vgg16, resnet50, gpt2, gpt:24x1024, mlp, ...), "
                                        "torchvision:NAME (needs torchvision) or module:PATH:Class")
    parser.add_argument("--batch", type=int, help="global batch size (samples per step)")
    parser.add_argument("--devices", help="array spec like tpu-v3:4,tpu-v2:4 or a100:8, or a YAML/JSON device file")
    parser.add_argument("--objective", choices=("time", "volume"), default="time",
                        help="minimise step time (default) or communicated bytes (HyPar's objective)")
    parser.add_argument("--types", type=int, choices=(2, 3), default=3,
                        help="3: types I/II/III (AccPar); 2: I/II only (HyPar's space)")
    parser.add_argument("--dtype-bytes", type=float, default=None,
                        help="bytes per tensor element (default 2; 4 with --measure, which runs float32)")
    parser.add_argument("--optimizer", choices=("sgd", "momentum", "adam", "adam-mixed"), default="adam",
                        help="optimizer state counted in memory: none, 1 or 2 buffers at --dtype-bytes, or "
                             "mixed-precision Adam's 12 bytes per weight (default adam)")
    parser.add_argument("--ignore-memory", action="store_true",
                        help="report memory per device but do not keep the plan within each device's capacity")
    parser.add_argument("--search", choices=("greedy", "lookahead"), default="greedy",
                        help="greedy: level by level (HyPar/AccPar); lookahead: weigh each level's best "
                             "alternatives by the levels below (never worse, slower)")
    parser.add_argument("--width", type=int, default=4, help="--search lookahead: alternatives per level (default 4)")
    parser.add_argument("--depth", type=int, default=1,
                        help="--search lookahead: levels below planned with look-ahead when weighing (default 1)")
    parser.add_argument("--input-shape", help="one sample's shape for module:PATH:Class models, e.g. 3,224,224")
    parser.add_argument("--json", metavar="OUT", help="write the plan and baselines as JSON to OUT")
    parser.add_argument("--table", action="store_true", help="print the table even when --json is given")
    parser.add_argument("--verify", action="store_true",
                        help="execute a small planned MLP on 2 and 4 gloo processes and compare with "
                             "the unpartitioned computation")
    parser.add_argument("--measure", action="store_true",
                        help="run one real training step of the plan on local gloo processes (one per device of "
                             "--devices, at most 8) and compare the prediction with the measurement; calibrate the "
                             "device file first with `hetrain profile`")
    parser.add_argument("--train", action="store_true",
                        help="train a built-in --workload on digits with the plan, one local process per device of "
                             "--devices (2 to 8), each device's speed and link emulated; report test accuracy, the "
                             "check against the unpartitioned model, and the step time beside the prediction and DDP's")
    parser.add_argument("--workload", default="cnn",
                        help="--train: cnn (hetrain train's digits CNN, default), mlp, or cnn-residual (a residual block)")
    parser.add_argument("--scheme", default="plan",
                        help="--train: which partitioning to train: plan (default), data-parallel, one-weird-trick, "
                             "hypar")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="--train: emulated seconds per device second (default: the plan's predicted step "
                             "lasts 0.1 s)")
    parser.add_argument("--lr", type=float, default=0.1, help="--train: SGD learning rate (default 0.1, momentum 0.9)")
    parser.add_argument("--steps", type=int, default=None,
                        help="--measure: timed steps after a warm-up (default 3); --train: training steps (default 300)")
    parser.add_argument("--calibrate-s", type=float, default=1.0,
                        help="--measure: seconds spent measuring FLOP/s and bandwidth before each timed step, for "
                             "the 'calibrated' prediction (0: skip; default 1)")
    parser.add_argument("--timeout-s", type=float, default=None,
                        help="--verify: limit for each run; --measure, --train: for the whole job (seconds; default "
                             "120, --train 900)")


def run(args: argparse.Namespace) -> int:
    if args.timeout_s is None:
        args.timeout_s = 900.0 if args.train else 120.0
    if args.verify:
        return _verify(args)
    if args.train:
        return _train(args)
    if args.steps is None:
        args.steps = 3
    for flag in ("model", "batch", "devices"):
        if getattr(args, flag) is None:
            raise UsageError(f"--{flag} is required (or use --verify)")
    if args.batch < 1:
        raise UsageError(f"--batch must be at least 1, got {args.batch}")
    dtype_bytes = args.dtype_bytes if args.dtype_bytes is not None else (4.0 if args.measure else 2.0)
    if not dtype_bytes > 0:
        raise UsageError(f"--dtype-bytes must be positive, got {dtype_bytes}")
    if args.measure:
        if dtype_bytes != 4.0:
            raise UsageError(f"--measure runs float32: leave --dtype-bytes at 4, not {dtype_bytes:g}")
        if args.steps < 1 or args.calibrate_s < 0:
            raise UsageError("--steps must be at least 1 and --calibrate-s not negative")
    from hetrain.planner import api

    devices = api.devices(args.devices)
    net = api.model(args.model, _shape(args.input_shape))
    result = api.compare_plans(net, args.batch, devices, args.objective, args.types, dtype_bytes,
                               optimizer=args.optimizer, fit_memory=not args.ignore_memory, search=args.search,
                               width=args.width, depth=args.depth)
    data = result.json()
    measured = None
    if args.measure:
        from hetrain.planner.execute import Program
        from hetrain.planner.measure import measure

        Program(net, args.batch, result.plans["plan"])  # unsupported models fail here, before any process starts
        measured = measure(net, args.batch, result.plans["plan"], devices, steps=args.steps,
                           timeout_s=args.timeout_s, calibrate_s=args.calibrate_s)
        data["measure"] = measured.json()
    if args.json:
        _write(args.json, data)
    if not args.json or args.table:
        print(result.table())
        if measured is not None:
            print()
            print(measured.table())
    return 0 if measured is None or measured.check.get("ok", True) else 1


def _train(args: argparse.Namespace) -> int:
    from hetrain.planner.train import SCHEMES, WORKLOADS

    if args.model is not None:
        raise UsageError("--train trains a built-in --workload (" + ", ".join(WORKLOADS) + "), not --model; for a "
                         "module of your own call hetrain.planner.train_with_plan (docs/guides/planner.md)")
    if args.measure:
        raise UsageError("--train and --measure are separate runs; drop one")
    if args.devices is None:
        raise UsageError("--train needs --devices, e.g. --devices tpu-v3:2,tpu-v2:2")
    if args.workload not in WORKLOADS:
        raise UsageError(f"--workload {args.workload!r}: choose one of {', '.join(WORKLOADS)}")
    if args.scheme not in SCHEMES:
        raise UsageError(f"--scheme {args.scheme!r}: choose one of {', '.join(SCHEMES)}")
    if args.dtype_bytes not in (None, 4.0):
        raise UsageError(f"--train runs float32: leave --dtype-bytes at 4, not {args.dtype_bytes:g}")
    steps = 300 if args.steps is None else args.steps
    batch = 64 if args.batch is None else args.batch
    if steps < 1 or batch < 1:
        raise UsageError(f"--steps and --batch must be at least 1 (got {steps}, {batch})")
    if not args.lr > 0:
        raise UsageError(f"--lr must be positive, got {args.lr}")
    from hetrain.data import load_dataset
    from hetrain.planner import api
    from hetrain.planner.trace import trace
    from hetrain.planner.train import DIGITS_SAMPLE, train_with_plan, workload_module

    devices = api.devices(args.devices)
    module = workload_module(args.workload)
    net = trace(module, DIGITS_SAMPLE, args.workload)
    optimizer = "momentum" if args.optimizer == "adam" else args.optimizer  # what --train runs: SGD with momentum
    result = api.compare_plans(net, batch, devices, args.objective, args.types, 4.0, optimizer=optimizer,
                               fit_memory=not args.ignore_memory, search=args.search, width=args.width,
                               depth=args.depth)
    report = train_with_plan(module, load_dataset("cnn"), DIGITS_SAMPLE, devices, batch, steps, args.scheme,
                             time_scale=args.time_scale, lr=args.lr, timeout_s=args.timeout_s, name=args.workload,
                             plans=result.plans)
    data = result.json()
    data["train"] = report.json()
    if args.json:
        _write(args.json, data)
    if not args.json or args.table:
        print(result.table())
        print()
        print(report.table())
    return 0 if report.checks_ok else 1


def _write(path, data) -> None:
    from hetrain.outputs import write_json_atomic

    try:
        write_json_atomic(path, data)
    except OSError as exc:
        raise UsageError(f"--json {path}: cannot write ({exc.strerror}); choose a writable path") from None
    print(f"wrote {path}")


def _shape(text: str | None):
    if text is None:
        return None
    try:
        shape = tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise UsageError(f"--input-shape {text!r}: write positive integers separated by commas, e.g. 3,224,224")
    return shape


def _verify(args: argparse.Namespace) -> int:
    from hetrain.planner.verify import verify_all

    ok = True
    for report in verify_all(timeout_s=args.timeout_s):
        print(report.line())
        ok = ok and report.ok
    return 0 if ok else 1
