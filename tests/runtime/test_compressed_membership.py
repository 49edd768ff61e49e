"""Compression across membership changes (issue 36): every receiver's replica of a sender's public copy
equals that copy, after any sequence of deaths and replacements.

Ring of 4, worker 2 killed, replaced, and killed again: the repair joins 1 and 3 while 2 is dead, the
replacement takes their edge away, the second death brings it back. Before issue 36 worker 1 kept
counting worker 3 as holding its public copy through the gap and sent it deltas against a copy 3 no
longer had (max |replica - copy| 0.70 for the rest of the run).
"""

import time

import torch

import hetrain
from hetrain.faults import Fault
from hetrain.jobs.local_job import run_local
from hetrain.runtime import hop as hop_module

SECOND_DEATH = "replacement-trained-1.5s"  # a phase only the first replacement enters


def _recorded(ctx, end_at: float):
    sent, received = [], []  # (iteration, dsts, checksum) and (src, src incarnation, iteration, checksum)
    send_update, on_message = hop_module.Hop._send_update, hop_module.Hop._on_message

    def recording_send(self, dsts, iteration, model):
        send_update(self, dsts, iteration, model)
        sent.append((iteration, sorted(dsts), float(self._public.public.double().sum())))

    def recording_receive(self, message):
        on_message(self, message)
        if message.kind in (hop_module.DELTA, hop_module.KEYFRAME):
            replica = self._replicas.public(message.src)
            received.append((message.src, self.incarnations[message.src], message.iteration,
                             float(replica.double().sum())))

    hop_module.Hop._send_update, hop_module.Hop._on_message = recording_send, recording_receive
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.randn(256, generator=torch.Generator().manual_seed(ctx.rank)))
    sync = hetrain.Hop(model, None, topology="ring", compression="int8", on_failure="respawn",
                         dead_workers=ctx.dead_workers, timeout_s=20)
    began = time.monotonic()
    noise = torch.Generator().manual_seed(1000 + ctx.rank + 10 * ctx.incarnation)
    second_death_due = ctx.incarnation == 1
    while time.time() < end_at:
        if second_death_due and time.monotonic() - began > 1.5:  # the others have seen it join by now
            second_death_due = False
            ctx.enter_phase(SECOND_DEATH)  # the launcher kills it here
        time.sleep(0.02)  # a step's compute
        with torch.no_grad():
            model.w.add_(torch.randn(256, generator=noise))  # the public copy keeps moving
        sync.step()
        ctx.report({"t_s": time.monotonic() - began})
    sync.finish()
    return ctx.rank, ctx.incarnation, sent, received


def test_replicas_equal_their_senders_copies_after_a_death_a_replacement_and_a_second_death(processes):
    results = run_local(_recorded, 4, (time.time() + 12.0,), on_failure="respawn", kills=[(2.5, 2)],
                        faults=[Fault(2, "phase", phase=SECOND_DEATH)], timeout_s=20)
    assert len(results) == 4
    assert all(result is not None for result in results), "a rank ended without a live worker (not replaced)"
    assert {rank: incarnation for rank, incarnation, _, _ in results}[2] == 2  # killed twice, replaced twice
    by_sender = {}  # (rank, incarnation) -> iteration -> [(dsts, checksum)]: a resend repeats an iteration
    for rank, incarnation, sent, _ in results:
        for it, dsts, checksum in sent:
            by_sender.setdefault((rank, incarnation), {}).setdefault(it, []).append((dsts, checksum))
    checked = mismatched = 0
    for rank, _, _, received in results:
        for src, src_incarnation, iteration, checksum in received:
            sender = by_sender.get((src, src_incarnation))
            if sender is None or iteration not in sender:  # a dead process's records died with it
                continue
            copies = [copy for dsts, copy in sender[iteration] if rank in dsts]
            assert copies, (rank, src, iteration)
            copy = copies[-1]
            checked += 1
            mismatched += abs(checksum - copy) > 1e-9 * max(1.0, abs(copy))
    assert checked > 200  # the edge 1-3 and the ring's others, over the whole run
    assert mismatched == 0, f"{mismatched} of {checked} replicas differed from their sender's copy"
    survivors = {rank: received for rank, _, _, received in results}
    assert any(src == 1 for src, *_ in survivors[3])  # the repaired edge carried messages
