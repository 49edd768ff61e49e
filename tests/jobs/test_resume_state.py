"""What a checkpoint holds and what a resume starts from (found by review, 2026-12-05 evening)."""

import torch

import hetrain
from hetrain.jobs.local_job import run_local


def _hop_loaded_after_build(ctx):
    torch.manual_seed(0)
    model = torch.nn.Linear(200, 50)
    saved = {k: v + (ctx.rank + 1) * 0.5 for k, v in model.state_dict().items()}  # each worker's checkpoint
    sync = hetrain.Hop(model, None, topology="ring", compression="topk:0.01", timeout_s=30)
    model.load_state_dict(saved)  # what --resume does: the protocol is built first, from the seeded model
    distances = []
    for _ in range(30):
        sync.step()  # no gradient: gossip alone
        distances.append(sync.state.gather().clone())
    sync.finish()
    return [d.numpy() for d in distances]


def test_hop_s_public_copies_follow_weights_loaded_after_the_protocol_was_built(processes):
    """The copies were seeded from the fresh model every worker starts from, and the loaded weights never
    reached them: CHOCO mixed towards copies nowhere near the models (the workers' distance 50.1 -> 46.2 in
    30 steps, against 49.1 -> 20.8 with the weights loaded first)."""
    first, second = run_local(_hop_loaded_after_build, 2, timeout_s=60)
    start, end = (float(torch.from_numpy(first[i] - second[i]).norm()) for i in (0, -1))
    assert end < 0.6 * start


def _prague_checkpoint(ctx):
    model = torch.nn.Linear(4, 1)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(ctx.rank))
    sync = hetrain.Prague(model, None, gg="random", group_size=2, timeout_s=30)
    sync.step()  # an exchange: its average runs in the background (preduce_overlap, the default)
    due = sync._checkpoint_due(True)
    saved = float(model.weight.flatten()[0])  # what the checkpoint would hold
    sync.finish()
    return due, saved


def test_a_checkpoint_holds_the_average_still_running_in_the_background(processes):
    """It was written without it, and a resumed worker has no average in flight: lost at every checkpoint."""
    for due, saved in run_local(_prague_checkpoint, 2, timeout_s=30):
        assert due and saved == 0.5


def _allreduce_restored_from_two_checkpoints(ctx):
    from hetrain.jobs.train_worker import _restore

    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sync = hetrain.AllReduce(model, optimizer)
    with torch.no_grad():
        model.weight.fill_(10.0 + ctx.rank)  # rank 1's file is of the checkpoint before (a death while writing)
    state = {"model": {k: v.clone() for k, v in model.state_dict().items()}, "optimizer": optimizer.state_dict(),
             "sampler": None, "rng": torch.get_rng_state(), "protocol": sync.state_dict()}

    class Sampler:
        def load_state_dict(self, state):
            pass

    _restore(state, model, optimizer, Sampler(), sync)
    weights = model.weight.flatten().tolist()
    sync.finish()
    return weights


def test_all_reduce_replicas_resume_as_one_model(processes):
    """Each rank loaded its own file, and DDP (which broadcasts only when built) kept the replicas apart
    for the whole resumed run: consensus distance 2.06 at the end where a consistent set gave 0."""
    first, second = run_local(_allreduce_restored_from_two_checkpoints, 2, timeout_s=30)
    assert first == second == [10.0] * 3


def _powersgd_resumed(ctx):
    from hetrain.jobs.train_worker import _restore

    def build(compression="powersgd:1"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(600, 600), torch.nn.Linear(600, 10))  # two buckets until DDP rebuilds them
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        return model, optimizer, hetrain.AllReduce(model, optimizer, compression=compression)

    steps = [0]

    def train(model, optimizer, sync, count):
        for _ in range(count):
            x = torch.randn(16, 600) + ctx.rank  # each worker its own data: its own residual
            optimizer.zero_grad()
            sync.module(x).square().mean().backward()
            optimizer.step()  # the protocol's step runs in the optimizer's hook
            steps[0] += 1

    class Sampler:
        def load_state_dict(self, state):
            pass

    def checkpoint(model, optimizer, sync):
        return {"model": {k: v.clone() for k, v in model.state_dict().items()}, "optimizer": optimizer.state_dict(),
                "sampler": None, "rng": torch.get_rng_state(), "protocol": sync.state_dict()}

    def tensors(protocol_state, *path):
        for key in path:
            protocol_state = protocol_state.get(key, {})
        return {i: t.clone() for i, t in protocol_state.items()}

    def equal(a, b):
        return bool(a) and a.keys() == b.keys() and all(torch.equal(a[i], b[i]) for i in a)

    torch.manual_seed(ctx.rank)
    model, optimizer, sync = build()
    train(model, optimizer, sync, 6)
    state = checkpoint(model, optimizer, sync)
    saved_error = tensors(state["protocol"], "own", "powersgd", "error")
    saved_q = tensors(state["protocol"], "powersgd", "q")
    sync.finish()

    facts = {}
    model, optimizer, sync = build()
    _restore(state, model, optimizer, Sampler(), sync)
    facts["iter_after_restore"] = sync._timer.hook_state.iter
    again = sync.state_dict()  # a checkpoint before anything was put back keeps what was loaded
    facts["saved_again"] = (equal(tensors(again, "own", "powersgd", "error"), saved_error)
                            and equal(tensors(again, "powersgd", "q"), saved_q))
    timer, put_back = sync._timer, {}
    original = timer.before_compressing

    def spy(bucket):
        original(bucket)
        hook, index = timer.hook_state, bucket.index()
        if index not in put_back:
            put_back[index] = (steps[0], *(None if t is None else t.clone()
                                           for t in (hook.error_dict.get(index), hook.q_memory_dict.get(index))))

    timer.before_compressing = spy
    steps[0] = 0
    train(model, optimizer, sync, 3)  # the first runs uncompressed (DDP rebuilds its buckets), then PowerSGD
    sync.finish()
    facts["put_back"] = {i: (step, error is not None and torch.equal(error, saved_error[i]),
                             q is not None and torch.equal(q, saved_q[i])) for i, (step, error, q) in put_back.items()}
    facts["error_norms"] = {i: float(t.norm()) for i, t in saved_error.items()}

    # Lightning and Accelerate load rank 0's one state on every rank: its residual is rank 0's alone
    model, optimizer, sync = build()
    shared = [state["protocol"]]
    torch.distributed.broadcast_object_list(shared, src=0, group=sync.job.group)
    sync.load_state_dict(shared[0])
    facts["residual_of_rank_0_taken"] = any(saved["error"] is not None for saved in sync._timer.restored.values())
    sync.finish()
    model, optimizer, sync = build("powersgd:2")  # P and Q of another rank would not fit: a cold start
    sync.load_state_dict(state["protocol"])
    facts["other_rank_restored"] = bool(sync._timer.restored) or sync._timer.hook_state.iter != 0
    sync.finish()
    return facts


def test_all_reduce_s_powersgd_resumes_with_its_warm_start_and_each_worker_s_own_residual(processes):
    """PowerSGD's state was not in the checkpoint: a resumed run started cold (random Q, the residuals of
    error feedback lost). Each worker's residual is its own, not rank 0's, though the replicas load rank 0's
    protocol state; one resumed iteration runs uncompressed (DDP rebuilds its buckets), and a checkpoint
    taken before the state was put back keeps it."""
    first, second = run_local(_powersgd_resumed, 2, timeout_s=60)
    for facts in (first, second):
        assert facts["iter_after_restore"] == 1 and facts["saved_again"], facts
        assert facts["put_back"] and all(step == 1 and error and q for step, error, q in facts["put_back"].values()), \
            facts["put_back"]
    assert first["error_norms"] != second["error_norms"] and min(first["error_norms"].values()) > 0
    assert first["residual_of_rank_0_taken"] and not second["residual_of_rank_0_taken"]
    assert not first["other_rank_restored"] and not second["other_rank_restored"]
