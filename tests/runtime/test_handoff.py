"""The processor's inbox. While it blocks in its Redis read, a message offered ends that
read through the wake-up the read handed out, once; only an answer to this read's wake-up
says it ended it, and only for the messages offered before it. A shard with a message
handed over and not settled takes its next messages the same way, whatever the processor
is doing."""

from __future__ import annotations

from collections.abc import Callable

from service.adapters.mqtt import Inbound
from service.core.events import Tick
from service.runtime.handoff import Handoff, TakenMessage
from service.runtime.intake import Accepted


def message(mid: int, shard: int = 0) -> TakenMessage:
    msg = Inbound(topic="t", payload=b"", qos=1, dup=False, mid=mid, received_at=0.0)
    event = Tick(kind="job", namespace="ns", name="j", due_ms=0)
    return TakenMessage(shard=shard, accepted=Accepted(event=event), digest=f"d{mid}", dup=False,
                        ingress_token="i:1", msg=msg, ack=lambda _: None)  # fmt: skip


def waker(answers: list[bool]) -> tuple[Callable[[], bool], list[int]]:
    calls: list[int] = []

    def wake() -> bool:
        calls.append(1)
        return answers.pop(0)

    return wake, calls


def test_a_message_offered_while_the_read_blocks_ends_it_once() -> None:
    handoff = Handoff()
    assert handoff.begin_blocking()
    # blocked, but the read has not said how to end it yet: the stream's way
    assert not handoff.offer_messages([message(1)])
    wake, calls = waker([True])
    handoff.blocked(wake)
    assert handoff.offer_messages([message(2), message(3)])
    assert handoff.offer_messages([message(4)])
    assert len(calls) == 1, "the first offer ends the read; the others only join it"
    # the read saw the streams at their end after 2 and 3; 4 may follow an entry appended
    # after the read ended, so it waits for the next read
    vouched = handoff.end_blocking()
    assert vouched == 2
    assert [m.msg.mid for m in handoff.take(vouched)[1]] == [2, 3]
    assert [m.msg.mid for m in handoff.take()[1]] == [4]


def test_a_wake_up_that_found_the_read_ended_says_so() -> None:
    handoff = Handoff()
    assert handoff.begin_blocking()
    wake, _ = waker([False])
    handoff.blocked(wake)
    assert handoff.offer_messages([message(1)])
    assert handoff.end_blocking() == 0, "the read ended by itself: it may have missed it"


def test_an_answer_after_its_read_ended_counts_for_no_later_read() -> None:
    handoff = Handoff()
    assert handoff.begin_blocking()
    answered: list[bool] = []

    def wake() -> bool:
        # the read ends (by itself) before this answer comes back, and the message waits
        assert handoff.end_blocking() == 0
        assert handoff.begin_blocking() is False, "the message waits: no blocking now"
        answered.append(True)
        return True

    handoff.blocked(wake)
    assert handoff.offer_messages([message(1)])
    assert answered and handoff.take()[1]
    assert handoff.begin_blocking()
    assert handoff.end_blocking() == 0, "the next read was not ended by anything"


def test_no_wake_up_outside_a_blocking_read() -> None:
    handoff = Handoff()
    wake, calls = waker([True])
    handoff.blocked(wake)  # a read that is not blocking (or has ended) hands out nothing
    assert handoff.offer_messages([message(1)])
    assert calls == [] and handoff.end_blocking() == 0


def test_a_shard_owed_a_message_takes_its_next_ones_even_when_offers_are_refused() -> None:
    handoff = Handoff()
    first = message(1, shard=3)
    assert handoff.offer_messages([first])
    handoff.take()  # the processor holds it; its commit fails on Redis
    handoff.close()
    assert handoff.owed() == {3}
    assert not handoff.offer_messages([message(2, shard=4)]), "another shard: the stream's way"
    assert handoff.offer_messages([message(3, shard=3)]), "behind the one it owes"
    assert handoff.owed() == {3}
    handoff.settled([first])
    assert handoff.owed() == {3}, "the second is owed still"
    _, messages = handoff.take()
    handoff.settled(messages)
    assert handoff.owed() == frozenset()
    assert not handoff.offer_messages([message(4, shard=3)]), "settled: the stream's way again"
