"""Each pair's two-member group is built once, and building one pair never holds up another's
(hetrain.transport.pair_links)."""

import threading
from types import SimpleNamespace

from hetrain.transport import pair_links
from hetrain.transport.pair_links import PairLinks


def test_a_pair_waiting_for_its_peer_does_not_hold_up_the_link_to_another_peer(monkeypatch):
    """Building the link to peer 1 waits (in the store) until peer 1 has built its side, which it does only
    once this process answered on its link to peer 2 (two ring neighbours joining together)."""
    answered_2 = threading.Event()

    def fake_pair_group(job, name, peer, incarnations, cpu=False):
        if peer == 1:
            assert answered_2.wait(timeout=5), "the link to peer 1 waited for ever: the link to 2 was held up"
        else:
            answered_2.set()
        return f"group-{peer}"

    monkeypatch.setattr(pair_links, "pair_group", fake_pair_group)
    links = PairLinks(SimpleNamespace(rank=0), "test")
    built, errors = {}, []

    def ask(peer):
        try:
            built[peer] = links.link(peer)
        except AssertionError as error:
            errors.append(str(error))

    first = threading.Thread(target=ask, args=(1,))
    first.start()
    while not links._building:  # the link to 1 is being built (and waits) before 2 is asked for
        threading.Event().wait(0.001)
    second = threading.Thread(target=ask, args=(2,))
    second.start()
    first.join(10)
    second.join(10)
    assert not errors, errors
    assert built == {1: ("group-1", 1), 2: ("group-2", 1)}


def test_threads_asking_for_one_pair_at_once_build_it_once(monkeypatch):
    calls, release = [], threading.Event()

    def fake_pair_group(job, name, peer, incarnations, cpu=False):
        calls.append(peer)
        release.wait(timeout=5)
        return object()

    monkeypatch.setattr(pair_links, "pair_group", fake_pair_group)
    links = PairLinks(SimpleNamespace(rank=3), "test")
    got = []
    threads = [threading.Thread(target=lambda: got.append(links.link(1))) for _ in range(4)]
    for thread in threads:
        thread.start()
    release.set()
    for thread in threads:
        thread.join(10)
    assert calls == [1] and len({id(group) for group, _ in got}) == 1 and {i for _, i in got} == {0}
