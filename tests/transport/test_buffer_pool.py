"""BufferPool: a buffer comes back only when nothing outside the pool uses it."""

import torch
from torch import nn

from hetrain.runtime.flat_state import FlatState
from hetrain.transport.buffer_pool import BufferPool


def _pool(**kwargs) -> BufferPool:
    return BufferPool(16, torch.float32, torch.device("cpu"), **kwargs)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_a_dropped_buffer_is_reused_and_a_held_one_is_not():
    pool = _pool()
    first = pool.take()
    address = first.untyped_storage().data_ptr()
    second = pool.take()
    assert not _same_memory(first, second)  # first is still held
    del first
    third = pool.take()
    assert third.untyped_storage().data_ptr() == address
    assert (pool.allocated, pool.reused, pool.kept) == (2, 1, 2)


def test_a_view_a_queue_or_a_pending_send_keeps_a_buffer_busy():
    pool = _pool()
    buffer = pool.take()
    address = buffer.untyped_storage().data_ptr()
    queue = [buffer[4:8]]  # only a slice survives, as a send or a queue might hold it
    detached = buffer.detach()
    del buffer
    assert pool.take().untyped_storage().data_ptr() != address
    del detached
    assert pool.take().untyped_storage().data_ptr() != address  # the slice still holds it
    queue.clear()
    assert pool.take().untyped_storage().data_ptr() == address


def test_idle_buffers_beyond_the_spares_are_let_go_and_capacity_bounds_what_is_kept():
    pool = _pool(capacity=4, spare=1)
    burst = [pool.take() for _ in range(6)]  # 4 kept, 2 plain
    assert pool.kept == 4 and pool.allocated == 6
    burst.clear()  # all idle now
    held = pool.take()  # reuses one, keeps one spare, lets two go
    assert pool.kept == 2 and pool.reused == 1
    assert held.numel() == 16


def test_a_pool_of_capacity_zero_allocates_every_time():
    pool = _pool(capacity=0)
    pool.take()
    pool.take()
    assert (pool.allocated, pool.reused, pool.kept) == (2, 0, 0)


def test_flat_state_gathers_into_recycled_buffers_that_never_alias_a_held_gather():
    model = nn.Linear(3, 2)
    state = FlatState(model)
    first = state.gather()
    expected = first.clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    second = state.gather()  # must not overwrite first, which a caller still holds
    assert torch.equal(first, expected) and not torch.equal(second, expected)
    del first
    third = state.gather()
    assert torch.equal(third, second) and not _same_memory(third, second)
    assert state.pool.reused >= 1
