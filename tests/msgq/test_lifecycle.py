"""Who comes first, who leaves, who dies: subscribers before publishers,
restarted publishers, reader slots, and segment files that do not pile up."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import msgq
from msgq import _msgq
from msgq.backends import shm
from msgq.names import segment_basename, segment_dir
from msgq.testing import segments, unique_topic


def test_subscriber_connected_before_the_publisher_gets_the_first_message():
    topic = unique_topic()
    sub = msgq.sub_sock(topic, timeout=2000)
    pub = msgq.pub_sock(topic)
    pub.send(b"first")
    assert sub.receive() == b"first"


def test_subscriber_follows_a_publisher_that_asks_for_another_ring_size():
    topic = unique_topic()
    sub = msgq.sub_sock(topic, timeout=2000)
    old = msgq.pub_sock(topic)
    old.send(b"in the old ring")
    new = msgq.pub_sock(topic, segment_size=4 << 20)
    new.send(b"in the new ring")
    with pytest.raises(msgq.MultiplePublishersError, match="another segment_size"):
        old.send(b"x")
    assert sub.receive() == b"in the old ring"  # drained first, nothing lost
    assert sub.receive() == b"in the new ring"
    assert sub._impl.segment_size == 4 << 20


def test_restarted_publisher_is_picked_up_by_existing_subscribers():
    topic = unique_topic()
    sub = msgq.sub_sock(topic, timeout=2000)
    for generation in range(3):
        pub = msgq.pub_sock(topic)
        pub.send(b"gen %d" % generation)
        pub.close()
        assert sub.receive() == b"gen %d" % generation


def test_segment_file_is_removed_when_the_last_participant_leaves(msgq_prefix):
    topic = unique_topic()
    pub = msgq.pub_sock(topic)
    sub = msgq.sub_sock(topic)
    assert segments(msgq_prefix) == [segment_basename(topic)]
    pub.close()
    assert segments(msgq_prefix) == [segment_basename(topic)]  # the subscriber still uses it
    sub.close()
    assert segments(msgq_prefix) == []


def test_segments_of_killed_processes_are_removed_by_the_next_publisher(msgq_prefix):
    topics = [unique_topic() for _ in range(3)]
    code = textwrap.dedent(f"""
        import os, signal, msgq
        socks = [msgq.pub_sock(t) for t in {topics!r}] + [msgq.sub_sock(t) for t in {topics!r}]
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-P", "-c", code], timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert segments(msgq_prefix) == sorted(segment_basename(t) for t in topics)
    shm._swept.discard(msgq_prefix)  # as for a new process
    with msgq.pub_sock(unique_topic()):
        assert segments(msgq_prefix) != [] and not set(segments(msgq_prefix)) & {segment_basename(t) for t in topics}
    # a live participant's segment is never swept
    keep = msgq.sub_sock(topics[0])
    assert shm.remove_stale_segments(msgq_prefix) == []
    keep.close()


def test_sixty_four_readers_all_receive_and_the_sixty_fifth_is_told_why():
    topic = unique_topic()
    pub = msgq.pub_sock(topic)
    subs = [msgq.sub_sock(topic, timeout=1000) for _ in range(_msgq.MAX_READERS)]
    assert _msgq.MAX_READERS >= 64
    with pytest.raises(msgq.TooManyReadersError, match="live readers"):
        msgq.sub_sock(topic)
    pub.send(b"to all")
    assert [s.receive() for s in subs] == [b"to all"] * len(subs)
    subs.pop(7).close()
    late = msgq.sub_sock(topic, timeout=1000)  # a freed slot is reused at once
    pub.send(b"again")
    assert late.receive() == b"again"
    assert pub.num_readers == _msgq.MAX_READERS


def test_reader_slots_of_killed_processes_are_reclaimed_one_by_one():
    topic = unique_topic()
    pub = msgq.pub_sock(topic)
    survivors = [msgq.sub_sock(topic, timeout=1000) for _ in range(10)]
    code = textwrap.dedent(f"""
        import os, signal, sys, msgq
        subs = [msgq.sub_sock({topic!r}) for _ in range(20)]
        sys.stdout.write("ready\\n"); sys.stdout.flush()
        sys.stdin.readline()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-P", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "ready\n"
    assert pub.num_readers == 30
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert pub.num_readers == 10  # only the dead ones went; the survivors keep receiving
    pub.send(b"still here")
    assert [s.receive() for s in survivors] == [b"still here"] * 10
    more = [msgq.sub_sock(topic) for _ in range(_msgq.MAX_READERS - 10)]
    assert pub.num_readers == _msgq.MAX_READERS
    del more


def test_forked_child_makes_its_own_sockets_and_leaves_the_parents_alone():
    topic = unique_topic()
    pub = msgq.pub_sock(topic)
    sub = msgq.sub_sock(topic, timeout=2000)
    pid = os.fork()
    if pid == 0:  # child: the inherited sockets are disowned; fresh ones work
        status = 0
        try:
            child_pub = msgq.pub_sock(unique_topic())
            child_pub.send(b"child")
            child_pub.close()
        except BaseException:
            status = 1
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    pub.send(b"parent")
    assert sub.receive() == b"parent"
    assert pub.num_readers == 1


def test_segments_live_in_the_configured_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("MSGQ_SHM_DIR", str(tmp_path))
    topic = unique_topic()
    with msgq.pub_sock(topic) as pub, msgq.sub_sock(topic, timeout=1000) as sub:
        pub.send(b"x")
        assert sub.receive() == b"x"
        assert os.listdir(tmp_path) == [segment_basename(topic)]
    assert os.listdir(tmp_path) == []
    assert segment_dir() == str(tmp_path)
