"""Under torchrun's shared agent store, the ranks of one attempt agree on a prefix of its own, also when
their agents' restart counts differ (an agent started for a lost node counts from 0) and the store
still holds a dead attempt's token."""

import datetime
import threading
import time

import pytest
import torch.distributed as dist

from hetrain.errors import WorkerError
from hetrain.transport.job import ATTEMPT_KEY, agree_on_attempt


def _agree(port: int, ranks, world_size: int, timeout_s: float = 10.0, delay_rank0_s: float = 0.0) -> dict:
    tokens: dict = {}

    def rank_main(rank: int) -> None:
        if rank == 0:
            time.sleep(delay_rank0_s)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=20))
        try:
            tokens[rank] = agree_on_attempt(store, rank, world_size, timeout_s)
        except WorkerError as exc:
            tokens[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return tokens


@pytest.fixture
def agent_store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def test_the_ranks_of_each_attempt_agree_on_a_fresh_token(loopback, agent_store):
    first = _agree(agent_store.port, range(4), 4)
    assert len(set(first.values())) == 1
    # the next attempt: the store holds the first one's token and its welcomes; rank 0 comes late,
    # so the others first read the dead attempt's token
    second = _agree(agent_store.port, range(4), 4, delay_rank0_s=1.0)
    assert len(set(second.values())) == 1, second
    assert second[0] != first[0]


def test_a_rank_without_a_live_rank_0_gives_up_naming_itself(loopback, agent_store):
    agent_store.set(ATTEMPT_KEY, "dead-attempt")
    tokens = _agree(agent_store.port, [1], 2, timeout_s=1.5)
    assert isinstance(tokens[1], WorkerError) and "rank 1" in str(tokens[1])
