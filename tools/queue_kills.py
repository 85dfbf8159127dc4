#!/usr/bin/env python3
"""Kill campaign for msgq.BroadcastQueue (RELIABILITY.md): a writer streams
messages of every size class (small, exactly a chunk, one byte over, many
chunks) to two local readers; reader 0 is a process SIGKILLed at random
moments and restarted under its rank, reader 1 stays. Checks that every
incarnation of reader 0 starts exactly where the queue says its predecessor
stopped (the message it was killed in is delivered again unless it had
already consumed it), that its messages are contiguous and intact, that
reader 1 gets everything, and that the writer never stalls.

    python tools/queue_kills.py --kills 200 [--seed N]

Exit 1 if anything was lost, torn, reordered or stalled.
"""

import argparse
import pickle
import random
import subprocess
import sys
import threading
import time

CHUNK = 1024
SIZES = (0, 100, CHUNK - 24, CHUNK - 23, 3 * CHUNK, 40 * CHUNK + 5)


def message(seq: int) -> bytes:
    size = SIZES[seq % len(SIZES)] if seq % 7 else random.Random(seq).randrange(60 * CHUNK)
    body = random.Random(seq).randbytes(max(size - 8, 0))
    return (seq.to_bytes(8, "little") + body)[:size] if size >= 8 else bytes(size)


def check(seq: int, data: bytes) -> bool:
    return data == message(seq)


def reader_main(handle_hex: str) -> None:
    import msgq

    q = msgq.BroadcastQueue.create_from_handle(pickle.loads(bytes.fromhex(handle_hex)), 0)
    seq = q._seq
    print(f"start {seq}", flush=True)
    while True:
        data = q.dequeue_bytes(timeout=60)
        print(f"{seq} {int(check(seq, data))}", flush=True)
        seq += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--reader", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reader:
        reader_main(args.reader[0])
        return 0
    import msgq
    from msgq.testing import isolated_prefix

    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    problems = []
    with isolated_prefix():
        queue = msgq.BroadcastQueue(n_readers=2, chunk_bytes=CHUNK, max_chunks=8)
        stays = msgq.BroadcastQueue.create_from_handle(queue.handle, 1)
        stop = threading.Event()
        sent = [0]
        got1 = [0]

        def write():
            while not stop.is_set():
                try:
                    queue.enqueue_bytes(message(sent[0]), timeout=60)
                except TimeoutError:
                    problems.append(f"the writer stalled at message {sent[0]}")
                    return
                except msgq.QueueShutdownError:
                    return
                sent[0] += 1

        def read_stays():
            while True:
                try:
                    data = stays.dequeue_bytes(timeout=60)
                except msgq.QueueShutdownError:
                    return
                except TimeoutError:
                    problems.append("reader 1 got nothing for 60 s")
                    return
                if not check(got1[0], data):
                    problems.append(f"reader 1: message {got1[0]} torn or out of order")
                got1[0] += 1

        threads = [threading.Thread(target=write), threading.Thread(target=read_stays)]
        for t in threads:
            t.start()
        handle_hex = pickle.dumps(queue.handle).hex()
        expected_start, delivered, unprinted = 0, 0, 0
        started = time.monotonic()
        for kill in range(args.kills + 1):
            proc = subprocess.Popen(
                [sys.executable, __file__, "--reader", handle_hex, "0"], stdout=subprocess.PIPE, text=True
            )
            first = proc.stdout.readline().split()
            if kill < args.kills:
                time.sleep(rng.uniform(0, 0.15))
                proc.kill()
            else:  # the last incarnation reads everything the writer wrote
                time.sleep(1.0)
                stop.set()
                threads[0].join(60)
                deadline = time.monotonic() + 60
                while queue._writer.reader_consumed(0) < sent[0] and time.monotonic() < deadline:
                    time.sleep(0.05)
                proc.kill()
            out, _ = proc.communicate()
            lines = [line.split() for line in out.splitlines()]
            start = int(first[1])
            consumed_now = queue._writer.reader_consumed(0)
            if start not in (expected_start, expected_start + 1):
                problems.append(f"incarnation {kill} started at {start}, the queue said {expected_start}")
            seqs = [int(s) for s, _ in lines]
            if seqs != list(range(start, start + len(seqs))):
                problems.append(f"incarnation {kill}: messages not contiguous")
            problems.extend(f"incarnation {kill}: message {s} torn" for s, ok in lines if ok != "1")
            delivered += len(seqs)
            if consumed_now > start + len(seqs):  # killed between its BR3 and its print: taken, not shown
                unprinted += 1
            expected_start = consumed_now
        final = queue._writer.reader_consumed(0)
        if final != sent[0]:
            problems.append(f"reader 0 consumed {final} of {sent[0]} messages")
        queue.shutdown()
        for t in threads:
            t.join(90)
        stays.close()
        queue.close()
    elapsed = time.monotonic() - started
    print(
        f"seed {seed}: {args.kills} reader SIGKILLs in {elapsed:.0f} s, {sent[0]} messages written "
        f"({sum(1 for s in range(sent[0]) if len(message(s)) > CHUNK - 24)} larger than a chunk), "
        f"reader 0 printed {delivered} (+{unprinted} taken in the instant it was killed), reader 1 took "
        f"{got1[0]}; reader 0's final count {final}; problems: {len(problems)}"
    )
    for p in problems[:20]:
        print("  " + p)
    return 1 if problems or got1[0] != sent[0] else 0


if __name__ == "__main__":
    sys.exit(main())
