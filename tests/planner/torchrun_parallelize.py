"""Run by tests/planner/test_plan_train.py under torchrun: a planned MLP trained against the whole model."""

import copy
import json
import sys

import torch
import torch.distributed as dist

from hetrain.data import ShardSampler, build_model, evaluate, load_dataset, loss_fn
from hetrain.planner import parallelize, plan_model


def main(out_path: str, steps: int = 30, batch: int = 32) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = build_model("mlp", seed=0)
    reference = copy.deepcopy(model)
    result = plan_model(model, batch, "tpu-v3:1,tpu-v2:1", input_shape=(64,), dtype_bytes=4, optimizer="momentum")
    plan = result.plans["plan"]
    planned = parallelize(model, plan, (64,), batch)
    opt = torch.optim.SGD(planned.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    data = load_dataset("mlp")
    sampler = ShardSampler(data, 0, 1, batch, 0)
    losses = []
    for _ in range(steps):
        x, y = sampler.next()
        losses.append(planned.train_step(x, y))
        opt.step()
        loss_fn(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    trained = planned.gathered_module()
    diff = max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(trained.parameters(), reference.parameters()))
    accuracy, _ = evaluate(trained, data.x_test, data.y_test)
    held = sum(p.numel() for p in planned.parameters())
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump({"diff": diff, "accuracy": accuracy, "losses": losses, "types": list(plan.assignment.types),
                       "alpha": plan.alpha, "held": held, "whole": sum(p.numel() for p in trained.parameters())},
                      f)
    dist.barrier()  # leave together: a gloo peer torn down while the other still runs can abort it
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
