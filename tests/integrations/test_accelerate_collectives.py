"""Inside a HetrainSync block the accelerator's collectives are local, and a dispatching loader is refused
(issue 38): the processes run apart there, so a collective would hold the fast ones (and deadlock Prague)."""

import pytest

pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

from hetrain.errors import UsageError  # noqa: E402
from hetrain.integrations.accelerate import local_collectives, refuse_dispatchers  # noqa: E402


class Collectives:
    """Stands for an Accelerator: each collective records that it ran."""

    def __init__(self):
        self.ran = []

    def wait_for_everyone(self):
        self.ran.append("wait")

    def gather(self, tensor):
        self.ran.append("gather")
        return torch.cat([tensor, tensor])

    def gather_for_metrics(self, input_data, use_gather_object=False):
        self.ran.append("gather_for_metrics")
        return torch.cat([input_data, input_data])

    def reduce(self, tensor, reduction="sum", scale=1.0):
        self.ran.append("reduce")
        return tensor * 2

    def pad_across_processes(self, tensor, dim=0, pad_index=0, pad_first=False):
        self.ran.append("pad")
        return tensor


def test_collectives_are_local_inside_the_block_and_back_after_it():
    acc = Collectives()
    x = torch.tensor([1.0, 2.0])
    undo = local_collectives(acc)
    acc.wait_for_everyone()
    assert torch.equal(acc.gather(x), x) and torch.equal(acc.gather_for_metrics(x), x)
    assert torch.equal(acc.reduce(x), x) and torch.equal(acc.reduce(x, scale=0.5), x * 0.5)
    assert acc.ran == []  # none of the real collectives ran
    undo()
    acc.wait_for_everyone()
    assert acc.gather(x).numel() == 4 and acc.ran == ["wait", "gather"]


def test_a_loader_that_dispatches_batches_from_process_0_is_refused_in_one_line():
    from accelerate.data_loader import DataLoaderDispatcher

    with pytest.raises(UsageError, match="dispatches batches from process 0") as err:
        refuse_dispatchers([object(), DataLoaderDispatcher.__new__(DataLoaderDispatcher)])
    assert "\n" not in str(err.value)
    refuse_dispatchers([object()])  # anything else passes
