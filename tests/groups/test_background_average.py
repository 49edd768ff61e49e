"""Prague's overlapped averaging (hetrain.groups.background_average): the correction, and no outer step
where no group ran."""

import torch

from hetrain.groups.background_average import BackgroundAverage


def _finish(ran: int | None):
    def reduce(flat, groups):
        if ran:
            flat.fill_(3.0)  # the group's average
        return ran

    stepped = []

    def transform(average):
        stepped.append(average.clone())
        return average * 2  # an outer step

    background = BackgroundAverage(reduce, "worker 0", timeout_s=10)
    background.start(torch.ones(2), ["a group"])
    model = torch.full((2,), 1.5)  # the snapshot plus the next step's 0.5
    background.finish(model, transform)
    return model, stepped


def test_the_average_lands_as_a_correction_through_the_outer_step():
    model, stepped = _finish(1)
    assert stepped and torch.equal(model, torch.full((2,), 6.5))  # 1.5 + (2 * 3 - 1)


def test_no_outer_step_where_every_group_failed():
    """A group with a dead member (continue) or a replaced one (respawn) averages nothing: stepping the
    worker's own unaveraged model and anchor there is the passive step that issue 36 removed."""
    model, stepped = _finish(0)
    assert not stepped and torch.equal(model, torch.full((2,), 1.5))


def test_a_sync_whose_every_group_failed_took_no_exchange():
    """Without overlap: the sync's groups ran none (a dead member each), so the outer step must not come."""
    import types

    from torch import nn

    from hetrain.runtime.flat_state import FlatState
    from hetrain.runtime.prague import Prague

    prague = object.__new__(Prague)  # the sync path alone, on stubs
    prague._background = prague._prefetch = None
    prague.gg = types.SimpleNamespace(request=lambda: ["a group"])
    prague._gg_wait_s, prague._empty_syncs, prague.local_work = 0.0, 0, "fixed"
    prague.state = FlatState(nn.Linear(2, 1))
    prague._update_extra = lambda: None
    for ran, averaged in ((0, False), (1, True)):
        prague._reduce = lambda flat, groups, weight=None, ran=ran: ran
        prague._sync()
        assert prague._averaged() is averaged
