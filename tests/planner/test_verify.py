"""`hetrain plan --verify`: partitioned execution on gloo processes matches plain autograd in float64."""

import pytest

from hetrain.planner.verify import BATCH, SIZES, Split, blocks, verify


def test_blocks_partition_every_layer():
    tree = Split(0.6, (1, 1, 2), Split(0.5, (1, 0, 2)), Split(0.3, (0, 2, 2)))
    per_rank = blocks(tree, 3)
    assert len(per_rank) == 4
    for i in range(3):
        volume = sum((b1 - b0) * (i1 - i0) * (o1 - o0) for (b0, b1), (i0, i1), (o0, o1) in (r[i] for r in per_rank))
        assert volume == BATCH * SIZES[i] * SIZES[i + 1]


@pytest.mark.timeout(120)
@pytest.mark.contract
def test_verify_two_processes(processes):
    reports = verify(2, timeout_s=90)
    assert reports and all(r.ok for r in reports), [r.line() for r in reports]
    assert max(r.grad_err for r in reports) <= 1e-5


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_verify_four_processes(processes):
    reports = verify(4, timeout_s=150)
    assert reports and all(r.ok for r in reports), [r.line() for r in reports]
