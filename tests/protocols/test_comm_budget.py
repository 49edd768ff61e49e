"""The communicator cache bounded by bytes: an entry count from the model's size, or a one-line refusal."""

import pytest

from hetrain.protocols.adpsgd_pairing import ADPSGDOptions
from hetrain.protocols.comm_budget import MB, NCCL_COMMUNICATOR_MB, cache_entries
from hetrain.protocols.comm_lru import CommunicatorLRU
from hetrain.protocols.group_generator import static_schedule
from hetrain.protocols.hop_config import HopOptions
from hetrain.protocols.options import OptionError
from hetrain.protocols.prague_options import PragueOptions


def test_entries_are_what_fits_the_budget_at_most_the_cap():
    model = 100 * MB
    assert cache_entries(60, 4096, model, 2, compressed=False, nccl=False) == 60  # gloo, plain: nothing held
    assert cache_entries(60, 4096, model, 2, compressed=True, nccl=False) == 20  # 4096 // (2 x 100)
    assert cache_entries(60, 4096, model, 4, compressed=True, nccl=False) == 10
    assert cache_entries(60, 4096, model, 2, compressed=False, nccl=True) == 4096 // NCCL_COMMUNICATOR_MB
    assert cache_entries(60, 4096, model, 2, compressed=True, nccl=True) == 4096 // (200 + NCCL_COMMUNICATOR_MB)
    assert cache_entries(5, 4096, model, 2, compressed=True, nccl=False) == 5


@pytest.mark.parametrize("compressed, nccl, message", [
    (True, False, "one member set keeps 2 x the 400 MB model (800 MB), more than {comm_memory_mb} 512: raise it "
                  "to 800 or more, or use {compression} none"),
    (False, True, "one member set keeps an NCCL communicator (about 128 MB), more than {comm_memory_mb} 100: "
                  "raise it to 128 or more"),
])
def test_a_model_that_cannot_fit_one_set_is_refused_in_one_line(compressed, nccl, message):
    budget = 512 if compressed else 100
    with pytest.raises(OptionError) as info:
        cache_entries(60, budget, 400 * MB, 2, compressed=compressed, nccl=nccl)
    assert info.value.template == message
    with pytest.raises(OptionError, match="comm_memory_mb must be >= 1, got 0"):
        cache_entries(60, 0, MB, 2, compressed=True, nccl=False)


def test_the_options_of_protocols_that_cache_member_sets_fit_themselves():
    prague = PragueOptions(group_size=3, comm_memory_mb=1000).fit_memory(100 * MB, compressed=True, nccl=False)
    assert prague.communicator_cache == 3 and prague.group_size == 3
    adpsgd = ADPSGDOptions(comm_memory_mb=1000).fit_memory(100 * MB, compressed=True, nccl=False)
    assert adpsgd.communicator_cache == 5  # pairs
    assert PragueOptions().caches_member_sets and not HopOptions().caches_member_sets
    assert HopOptions().fit_memory(100 * MB, compressed=True, nccl=True) == HopOptions()
    with pytest.raises(OptionError, match="comm_memory_mb must be >= 1"):
        PragueOptions(comm_memory_mb=0).validate(4)


def test_the_static_schedule_by_node_is_budgeted_for_its_largest_groups():
    """Its groups are a node's workers and one worker of each node, not group_size members: sized for
    pairs, worker 0 held 48 MB of public copies under a 40 MB budget (16 workers, 4 a node, 4 MiB model)."""
    flat = 4 * 2**20
    options = PragueOptions(gg="static", group_size=2, workers_per_node=4, comm_memory_mb=40)
    fitted = options.fit_memory(flat, compressed=True, nccl=False, num_workers=16)
    steps = static_schedule(16, 2, workers_per_node=4)
    for worker in range(16):
        cache, peak = CommunicatorLRU(fitted.communicator_cache), 0
        for k in range(2 * len(steps)):
            for group in steps[k % len(steps)]:
                if worker in group:
                    cache.use(group, 0)
            peak = max(peak, sum(len(members) for members in cache._entries) * flat)
        assert peak <= 40 * 2**20
