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


def test_hop_s_public_copies_follow_weights_loaded_after_the_protocol_was_built():
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
    due = sync.checkpoint_due(True)
    saved = float(model.weight.flatten()[0])  # what the checkpoint would hold
    sync.finish()
    return due, saved


def test_a_checkpoint_holds_the_average_still_running_in_the_background():
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


def test_all_reduce_replicas_resume_as_one_model():
    """Each rank loaded its own file, and DDP (which broadcasts only when built) kept the replicas apart
    for the whole resumed run: consensus distance 2.06 at the end where a consistent set gave 0."""
    first, second = run_local(_allreduce_restored_from_two_checkpoints, 2, timeout_s=30)
    assert first == second == [10.0] * 3


def _powersgd_resumed(ctx):
    from hetrain.jobs.train_worker import _restore

    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(600, 600), torch.nn.Linear(600, 10))  # two buckets until DDP rebuilds them
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        return model, optimizer, hetrain.AllReduce(model, optimizer, compression="powersgd:1")

    def train(model, optimizer, sync, steps):
        for _ in range(steps):
            x = torch.randn(16, 600) + ctx.rank  # each worker its own data: its own residual
            optimizer.zero_grad()
            sync.module(x).square().mean().backward()
            optimizer.step()  # the protocol's step runs in the optimizer's hook

    class Sampler:
        def load_state_dict(self, state):
            pass

    torch.manual_seed(ctx.rank)
    model, optimizer, sync = build()
    train(model, optimizer, sync, 6)
    state = {"model": {k: v.clone() for k, v in model.state_dict().items()}, "optimizer": optimizer.state_dict(),
             "sampler": None, "rng": torch.get_rng_state(), "protocol": sync.state_dict()}
    saved_error = {i: t.clone() for i, t in state["protocol"].get("own", {}).get("powersgd", {}).get("error", {}).items()}
    saved_q = {i: t.clone() for i, t in state["protocol"].get("powersgd", {}).get("q", {}).items()}
    sync.finish()

    model, optimizer, sync = build()
    _restore(state, model, optimizer, Sampler(), sync)
    timer, put_back = sync._timer, {}
    original = timer.before_compressing

    def spy(bucket):
        original(bucket)
        hook = timer.hook_state
        put_back.setdefault(bucket.index(), (hook.error_dict.get(bucket.index()), hook.q_memory_dict.get(bucket.index())))
        put_back[bucket.index()] = tuple(None if t is None else t.clone() for t in put_back[bucket.index()])

    timer.before_compressing = spy
    train(model, optimizer, sync, 3)  # the first runs uncompressed (DDP rebuilds its buckets), then PowerSGD
    sync.finish()
    same = {i: (put_back[i][0] is not None and torch.equal(put_back[i][0], saved_error[i]),
                put_back[i][1] is not None and torch.equal(put_back[i][1], saved_q[i])) for i in saved_error}
    return same, {i: float(t.norm()) for i, t in saved_error.items()}


def test_all_reduce_s_powersgd_resumes_with_its_warm_start_and_each_worker_s_own_residual():
    """PowerSGD's state was not in the checkpoint: a resumed run started cold (random Q, the residuals of
    error feedback lost). Each worker's residual is its own, not rank 0's, though the replicas load rank 0's
    protocol state."""
    (same_0, norms_0), (same_1, norms_1) = run_local(_powersgd_resumed, 2, timeout_s=60)
    assert same_0 and all(error and q for error, q in same_0.values()), same_0
    assert all(error and q for error, q in same_1.values()), same_1
    assert norms_0 != norms_1 and min(norms_0.values()) > 0
