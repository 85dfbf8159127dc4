"""How a send wakes subscribers asleep in a blocking receive (MSGQ_WAKE): "all"
(one FUTEX_WAKE of the publisher wakes every sleeper) and "handoff" (the
publisher wakes one, that subscriber wakes the rest), across real processes.

Lock-step: each message is sent while every subscriber sleeps (spin 0, a pause
first), and must reach all of them before the next one is sent, so a wake-up
lost would leave a subscriber asleep past the deadline instead of being hidden
by the next message. The publisher's own count of the sleepers it woke shows
which mode ran. cpp/msgq/model/wake.pml checks the same protocol exhaustively.
"""

import mmap
import os
import random
import signal
import struct
import threading
import time

import mp_helpers
import pytest
import shm_watch
from mp_helpers import SPAWN, Children, encode

import msgq
from msgq.errors import InvalidArgumentError
from msgq.testing import unique_topic

READERS = 4
MESSAGES = 60
STEP_S = 10.0  # bound on one message reaching every subscriber (a loaded 2-core machine)


def _start(children, topic, names, count):
    readies = []
    for name in names:
        ready = SPAWN.Event()
        children.start(mp_helpers.receive_and_ack, name, topic, count, ready)
        readies.append(ready)
    assert all(r.wait(60) for r in readies)


def _lock_step(pub, children, names, first, last):
    """Send messages ``first..last``; each must reach every one of ``names`` before the next."""
    for seq in range(first, last + 1):
        time.sleep(0.005)  # every subscriber back asleep
        pub.send(encode(seq, b"x" * (seq % 97)))
        reports = children.collect(names, timeout=STEP_S)
        assert all(r["seq"] == seq for r in reports.values()), (seq, reports)


OTHER = {"all": "handoff", "handoff": "all"}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("via", ["env", "argument"])
@pytest.mark.parametrize("wake", ["all", "handoff"])
def test_every_sleeping_subscriber_gets_every_message_in_lock_step(monkeypatch, wake, via):
    """The mode from MSGQ_WAKE, or from ``pub_sock(wake=...)``, which wins over it."""
    monkeypatch.setenv("MSGQ_WAKE", wake if via == "env" else OTHER[wake])
    monkeypatch.setenv("MSGQ_SPIN_US", "0")
    topic = unique_topic()
    names = [f"sub{i}" for i in range(READERS)]
    with msgq.pub_sock(topic, wake=wake if via == "argument" else None) as pub, Children() as children:
        assert pub.wake == wake
        _start(children, topic, names, MESSAGES)
        _lock_step(pub, children, names, 0, MESSAGES - 1)
        woken = pub.readers_woken
    if wake == "handoff":
        # The publisher woke at most one sleeper per message; the subscribers woke the rest.
        assert 0 < woken <= MESSAGES, woken
    else:
        assert woken > 2 * MESSAGES, woken  # several sleepers per message, all by the publisher


@pytest.mark.timeout(180)
def test_a_subscriber_killed_mid_stream_does_not_stall_the_others(monkeypatch):
    """SIGKILL one of the sleepers: its sleeping bit stays behind, and whichever
    sleeper the publisher wakes still wakes the rest (the dead one is no longer
    queued on the futex)."""
    monkeypatch.setenv("MSGQ_WAKE", "handoff")
    monkeypatch.setenv("MSGQ_SPIN_US", "0")
    topic = unique_topic()
    names = [f"sub{i}" for i in range(READERS)]
    with msgq.pub_sock(topic) as pub, Children() as children:
        _start(children, topic, names, MESSAGES)
        _lock_step(pub, children, names, 0, 19)
        victim = children.procs[0]
        time.sleep(0.005)
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        _lock_step(pub, children, names[1:], 20, MESSAGES - 1)
        assert pub.readers_woken <= MESSAGES


WAKE_LINE = 128  # cpp/msgq/layout.h: futex_seq at byte 128, handoff_pending at 132


@pytest.mark.timeout(180)
@pytest.mark.parametrize("wake", ["all", "handoff"])
def test_a_peer_scribbling_on_the_wake_words_delays_wake_ups_but_loses_nothing(monkeypatch, wake):
    """Another process with write access (the same user: the wake words are trusted
    state, RELIABILITY.md) stores garbage into futex_seq and handoff_pending while
    messages flow: subscribers may wake needlessly, or (handoff) late, at the next
    message, but every message reaches every subscriber, intact and in order, and
    once the scribbling stops a message wakes them all again."""
    monkeypatch.setenv("MSGQ_WAKE", wake)
    monkeypatch.setenv("MSGQ_SPIN_US", "0")
    topic = unique_topic()
    names = [f"sub{i}" for i in range(3)]
    count = 60
    stop = threading.Event()
    with msgq.pub_sock(topic) as pub, Children() as children:
        readies = []
        for name in names:
            readies.append(SPAWN.Event())
            children.start(mp_helpers.receive_messages, name, topic, 0, count, readies[-1])
        assert all(r.wait(60) for r in readies)
        with open(pub._impl.path, "r+b") as f, mmap.mmap(f.fileno(), 4096) as header:

            def scribble():
                rng = random.Random(7)
                while not stop.is_set():
                    garbage = struct.pack("<II", rng.getrandbits(32), rng.choice((0, 1, 2**32 - 1)))
                    header[WAKE_LINE : WAKE_LINE + 8] = garbage
                    time.sleep(0.0003)

            scribbler = threading.Thread(target=scribble)
            scribbler.start()
            try:
                for seq in range(count - 1):
                    time.sleep(0.005)
                    pub.send(encode(seq, b"y" * (seq % 61)))
            finally:
                stop.set()
                scribbler.join()
        time.sleep(0.05)  # every subscriber asleep again, on words nobody scribbles now
        pub.send(encode(count - 1, b"last"))
        reports = children.collect(names, timeout=60)
    for name, r in reports.items():
        assert r["count"] == count and r["error_count"] == 0, (name, r)
        assert r["generations"][0]["missed"] == 0, (name, r)


@pytest.mark.parametrize("value", ["sometimes", "ALL", "1"])
def test_a_bad_msgq_wake_is_refused_before_anything_is_created(monkeypatch, msgq_prefix, value):
    monkeypatch.setenv("MSGQ_WAKE", value)
    topic = unique_topic()
    before = shm_watch.listing()
    with pytest.raises(InvalidArgumentError, match="MSGQ_WAKE must be 'all' or 'handoff'"):
        msgq.pub_sock(topic)
    assert shm_watch.added(before, msgq_prefix) == set()


@pytest.mark.parametrize("value", ["sometimes", "ALL", "", 1, True])
def test_a_bad_wake_argument_is_refused_before_anything_is_created(monkeypatch, msgq_prefix, value):
    monkeypatch.setenv("MSGQ_WAKE", "handoff")  # a good environment does not excuse a bad argument
    topic = unique_topic()
    before = shm_watch.listing()
    with pytest.raises(InvalidArgumentError, match="wake must be 'all' or 'handoff'"):
        msgq.pub_sock(topic, wake=value)
    assert shm_watch.added(before, msgq_prefix) == set()
