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
