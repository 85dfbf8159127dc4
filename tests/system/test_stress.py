"""Multi-process stress: one publisher, many subscribers, random sizes, a small
ring that wraps thousands of times, slow, killed and conflating readers,
killed and restarted writers. Every delivered message must be intact (its
blake2b checksum matches) and in order; every loss must be explained by a
counted reset.

Children are spawned processes (see mp_helpers); each test has a pytest-timeout
watchdog, and the Children harness kills whatever is still running when a test
ends.
"""

import os
import signal
import time

import mp_helpers
import pytest
from mp_helpers import SPAWN, Children, decode, encode, ring_bytes_at_most, wait_until_asleep

import msgq
from msgq import _msgq
from msgq.testing import unique_topic

SMALL_RING = 64 * 1024


def check_in_order_and_explained(name, report, sent):
    """A normal (non-conflating) subscriber of one stream of ``sent`` messages
    numbered from 0: intact, strictly increasing, and every message it did not
    get is explained by one of its resets. Returns its stats."""
    assert report["error_count"] == 0, f"{name}: {report['error_count']} bad messages, e.g. {report['errors']}"
    stats = report["generations"].get(0, {"count": 0, "first": sent, "last": -1, "gaps": 0, "missed": 0})
    assert report["count"] == stats["count"]
    missed_at_start = stats["first"]
    missed_at_end = sent - 1 - stats["last"]
    assert missed_at_start >= 0 and missed_at_end >= 0, f"{name}: sequence numbers outside 0..{sent - 1}"
    lost = missed_at_start + stats["missed"] + missed_at_end
    assert stats["count"] + lost == sent, f"{name}: {stats['count']} delivered + {lost} lost != {sent} sent"
    # Between two resets a reader reads the ring in order, so each run of
    # missing sequence numbers needs a reset of its own.
    holes = stats["gaps"] + (missed_at_start > 0) + (missed_at_end > 0)
    assert holes <= report["resets"], f"{name}: {holes} holes in the stream but only {report['resets']} resets"
    if report["resets"] == 0:
        assert lost == 0, f"{name}: lost {lost} messages without being reset"
    return stats


def run_stream(topic, target_ring_bytes, subscribers, burst_bytes=None, max_payload=None, seed=1, zero_copy=False):
    """One publisher and ``subscribers`` ({name: kwargs of subscribe_stream})
    in their own processes; returns (publisher report, {name: report})."""
    barrier = SPAWN.Barrier(len(subscribers) + 1)
    done = SPAWN.Event()
    with Children() as children:
        for name, kwargs in subscribers.items():
            children.start(
                mp_helpers.subscribe_stream,
                name,
                topic,
                SMALL_RING,
                barrier,
                done,
                kwargs.get("conflate", False),
                kwargs.get("pause_s", 0.0),
            )
        children.start(
            mp_helpers.publish_stream,
            "publisher",
            topic,
            SMALL_RING,
            target_ring_bytes,
            seed,
            barrier,
            done,
            max_payload,
            burst_bytes,
            0,
            zero_copy,
        )
        reports = children.collect(["publisher", *subscribers], timeout=100)
    return reports.pop("publisher"), reports


@pytest.mark.timeout(120)
@pytest.mark.parametrize("zero_copy", [False, True], ids=["send", "loan"])
def test_lapped_reader_is_reset_not_torn(zero_copy):
    """An unpaced publisher (copying sends, or loans filled in place) laps a
    reader that sleeps between receives: the reader is reset (and counts it),
    never handed a torn or repeated message; a conflating reader sees only
    increasing sequence numbers."""
    topic = unique_topic()
    wraps_wanted = 2000
    publisher, subs = run_stream(
        topic,
        target_ring_bytes=wraps_wanted * SMALL_RING,
        subscribers={"slow": {"pause_s": 0.005}, "eager": {}, "newest": {"conflate": True}},
        zero_copy=zero_copy,
    )
    sent = publisher["sent"]
    assert publisher["segment_size"] == SMALL_RING
    assert publisher["ring_bytes"] // SMALL_RING >= wraps_wanted  # the ring really wrapped that often
    assert publisher["max_payload"] >= SMALL_RING // 3  # messages up to a large fraction of the ring

    slow = check_in_order_and_explained("slow", subs["slow"], sent)
    assert subs["slow"]["resets"] > 0, "a reader sleeping between receives was never lapped"
    assert slow["count"] < sent
    check_in_order_and_explained("eager", subs["eager"], sent)

    newest = subs["newest"]
    assert newest["error_count"] == 0, f"conflate reader got bad messages, e.g. {newest['errors']}"
    stats = newest["generations"][0]
    assert 0 < stats["count"] <= sent
    assert stats["last"] <= sent - 1
    # The newest message is what a conflating reader ends with, unless a lap
    # reset it past the end of the stream.
    assert stats["last"] == sent - 1 or newest["resets"] > 0


@pytest.mark.timeout(120)
def test_readers_that_keep_up_receive_every_message_across_wraparounds():
    """The publisher sends bursts of at most half the ring and waits until all
    readers have read them: no reader is ever lapped, so each gets every
    message, and the conflating one ends with the newest."""
    topic = unique_topic()
    wraps_wanted = 300
    burst = SMALL_RING // 2
    # A burst plus the largest message (the space a wrap can waste) must not
    # reach a reader that waits at the end of the previous burst.
    max_payload = SMALL_RING // 4 - mp_helpers.OVERHEAD
    assert burst + ring_bytes_at_most(max_payload + mp_helpers.OVERHEAD) < SMALL_RING - 16
    publisher, subs = run_stream(
        topic,
        target_ring_bytes=wraps_wanted * SMALL_RING,
        subscribers={"a": {}, "b": {}, "c": {}, "newest": {"conflate": True}},
        burst_bytes=burst,
        max_payload=max_payload,
        seed=2,
    )
    sent = publisher["sent"]
    assert publisher["ring_bytes"] // SMALL_RING >= wraps_wanted
    assert publisher["readers"] == len(subs)
    for name in ("a", "b", "c"):
        report = subs[name]
        assert report["resets"] == 0, f"{name} was lapped although the publisher waited for it"
        stats = check_in_order_and_explained(name, report, sent)
        assert (stats["count"], stats["first"], stats["last"], stats["gaps"]) == (sent, 0, sent - 1, 0)
    newest = subs["newest"]
    assert newest["error_count"] == 0, newest["errors"]
    assert newest["resets"] == 0
    assert newest["generations"][0]["last"] == sent - 1
    assert newest["generations"][0]["count"] <= sent


@pytest.mark.timeout(90)
def test_subscriber_killed_while_blocked_does_not_stop_the_others_and_its_slot_is_reclaimed():
    topic = unique_topic()
    messages = [encode(seq, os.urandom(seq % 200)) for seq in range(150)]
    # All of them fit in the ring at once, so the survivor can never be lapped.
    assert sum(ring_bytes_at_most(len(m)) for m in messages) < SMALL_RING - 16
    victim_ready, survivor_ready, survivor_may_leave = SPAWN.Event(), SPAWN.Event(), SPAWN.Event()
    with msgq.pub_sock(topic, segment_size=SMALL_RING) as pub, Children() as children:
        victim = children.start(mp_helpers.block_in_receive, "victim", topic, SMALL_RING, victim_ready)
        survivor = children.start(
            mp_helpers.receive_messages,
            "survivor",
            topic,
            SMALL_RING,
            len(messages),
            survivor_ready,
            survivor_may_leave,
        )
        assert victim_ready.wait(60) and survivor_ready.wait(60)
        assert pub.wait_for_readers(2, timeout=30)
        assert pub.num_readers == 2
        # Both asleep in receive(): their bits are set in the sleepers' mask.
        assert wait_until_asleep(victim.pid) and wait_until_asleep(survivor.pid)

        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        assert victim.exitcode == -signal.SIGKILL

        for msg in messages:
            pub.send(msg)  # must neither block nor fail on the dead sleeper
        report = children.collect(["survivor"], timeout=60)["survivor"]
        assert report["error_count"] == 0, report["errors"]
        assert report["resets"] == 0
        assert report["generations"][0] == {
            "count": len(messages),
            "first": 0,
            "last": len(messages) - 1,
            "gaps": 0,
            "missed": 0,
        }
        assert pub.num_readers == 1  # the survivor; the victim's slot is free again
        survivor_may_leave.set()
        survivor.join(30)
        assert pub.num_readers == 0
        with msgq.sub_sock(topic, timeout=5000) as again:
            assert pub.num_readers == 1
            pub.send(b"after")
            assert again.receive() == b"after"


@pytest.mark.timeout(90)
def test_killed_publisher_is_replaced_by_a_restarted_one_and_existing_subscribers_follow():
    """A publisher killed mid-stream (quite possibly inside a send) is
    restarted as a new process on the same topic; subscribers attached all
    along receive every message of the new one."""
    topic = unique_topic()
    ring = 256 * 1024
    names = ["reader1", "reader2"]
    ready = {n: SPAWN.Event() for n in names}
    first_seen = {n: SPAWN.Event() for n in names}
    started, done = SPAWN.Event(), SPAWN.Event()
    barrier = SPAWN.Barrier(1)  # the readers are attached already: no one to wait for
    with Children() as children:
        for n in names:
            children.start(mp_helpers.subscribe_until_done, n, topic, ring, ready[n], first_seen[n], done)
        assert all(ready[n].wait(60) for n in names)
        first = children.start(mp_helpers.publish_until_killed, "first", topic, ring, 1, 11, started)
        assert started.wait(60)
        assert all(first_seen[n].wait(60) for n in names)
        os.kill(first.pid, signal.SIGKILL)
        first.join(10)
        assert first.exitcode == -signal.SIGKILL

        # Paced by the readers, so they lose nothing of generation 2; it sets
        # done once they have read everything.
        children.start(
            mp_helpers.publish_stream, "restarted", topic, ring, 2 * ring, 12, barrier, done, 200, ring // 2, 2
        )
        reports = children.collect(["restarted", *names], timeout=60)

    restarted = reports["restarted"]
    assert restarted["readers"] == len(names)
    for n in names:
        report = reports[n]
        assert report["error_count"] == 0, f"{n}: {report['errors']}"
        gens = report["generations"]
        assert set(gens) == {1, 2}, f"{n} saw generations {sorted(gens)}"
        assert gens[1]["count"] >= 1
        assert gens[2] == {
            "count": restarted["sent"],
            "first": 0,
            "last": restarted["sent"] - 1,
            "gaps": 0,
            "missed": 0,
        }, f"{n} lost messages of the restarted publisher"


@pytest.mark.timeout(60)
def test_publisher_killed_while_holding_a_loan_is_replaced_and_its_half_written_message_never_appears():
    """The old publisher dies inside a write (a loan it filled halfway); the
    restarted one continues the ring: a reader sees the old messages, then the
    new ones, nothing in between, and a reader asleep across the restart is
    woken by the new publisher."""
    topic = unique_topic()
    ring = 64 * 1024
    before = 20
    loaned, asleep_ready = SPAWN.Event(), SPAWN.Event()
    with msgq.sub_sock(topic, timeout=5000, segment_size=ring) as sub, Children() as children:
        first = children.start(mp_helpers.hold_loan_until_killed, "first", topic, ring, 1, before, loaned)
        assert loaned.wait(60)
        os.kill(first.pid, signal.SIGKILL)
        first.join(10)
        assert first.exitcode == -signal.SIGKILL
        # Joins after the last old message: it waits for the restarted publisher.
        asleep = children.start(mp_helpers.receive_messages, "asleep", topic, ring, before, asleep_ready)
        assert asleep_ready.wait(60) and wait_until_asleep(asleep.pid)
        with msgq.pub_sock(topic, segment_size=ring) as restarted:
            for seq in range(before):
                restarted.send(encode(seq, b"y" * seq, 2))
            got = [decode(sub.receive()) for _ in range(2 * before)]
            assert got == [(1, s) for s in range(before)] + [(2, s) for s in range(before)]
            assert sub.receive(non_blocking=True) is None
            assert sub.resets == 0
            report = children.collect(["asleep"], timeout=60)["asleep"]
    assert report["error_count"] == 0, report["errors"]
    assert report["generations"] == {2: {"count": before, "first": 0, "last": before - 1, "gaps": 0, "missed": 0}}


@pytest.mark.timeout(60)
def test_publisher_killed_mid_send_can_be_replaced_before_its_parent_reaps_it():
    """A SIGKILLed process is dead even while it is a zombie (its parent has
    not waited for it yet, which is up to a third party): a new publisher must
    take the topic over at once, not wait for the old pid to disappear."""
    topic = unique_topic()
    ring = 64 * 1024
    loaned = SPAWN.Event()
    with msgq.sub_sock(topic, timeout=5000, segment_size=ring) as sub, Children() as children:
        first = children.start(mp_helpers.hold_loan_until_killed, "first", topic, ring, 1, 0, loaned)
        assert loaned.wait(60)
        os.kill(first.pid, signal.SIGKILL)
        # Do not join (or poll) it: it stays a zombie until the block ends.
        deadline = time.monotonic() + 10
        while mp_helpers.process_state(first.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert mp_helpers.process_state(first.pid) == "Z"
        with msgq.pub_sock(topic, segment_size=ring) as restarted:
            restarted.send(encode(0, b"new", 2))
            assert decode(sub.receive()) == (2, 0)


@pytest.mark.timeout(90)
def test_sixty_four_subscribers_all_receive_a_message_and_a_sixty_fifth_is_refused():
    """The reference evicts every reader when a 16th arrives; we keep all 64,
    refuse the next with a clear error, and free a killed process's slots."""
    max_readers = _msgq.MAX_READERS
    assert max_readers >= 64
    processes, per_process = 4, max_readers // 4
    assert processes * per_process == max_readers
    topic = unique_topic()
    names = [f"holder{i}" for i in range(processes)]
    ready = [SPAWN.Event() for _ in names]
    release = SPAWN.Event()
    payload = os.urandom(1000)
    with msgq.pub_sock(topic) as pub, Children() as children:
        procs = [
            children.start(mp_helpers.hold_subscribers, n, topic, per_process, ready[i], release)
            for i, n in enumerate(names)
        ]
        assert all(e.wait(60) for e in ready)
        assert pub.num_readers == max_readers

        with pytest.raises(msgq.TooManyReadersError) as refused:
            msgq.sub_sock(topic)
        message = str(refused.value)
        assert topic in message and str(max_readers) in message

        pub.send(payload)
        reports = children.collect(names, timeout=60)
        received = [m for n in names for m in reports[n]["received"]]
        assert received == [payload] * max_readers

        # A whole process of subscribers dies: its slots go to new subscribers
        # without anyone asking num_readers first.
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].join(10)
        newcomers = [msgq.sub_sock(topic, timeout=5000) for _ in range(per_process)]
        try:
            with pytest.raises(msgq.TooManyReadersError):
                msgq.sub_sock(topic)
            assert pub.num_readers == max_readers
            pub.send(b"second")
            assert [s.receive() for s in newcomers] == [b"second"] * per_process
        finally:
            for s in newcomers:
                s.close()
        release.set()
