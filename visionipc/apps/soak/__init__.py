"""Fault-injection soak: many processes on msgq topics and a VisionIPC stream,
killed, stopped and restarted at random moments; afterwards, proof that
nothing was torn, reordered, silently lost or leaked.

Processes (each a separate ``python -m visionipc.apps.soak --role ...``):

- msgq publishers on two topics: ``firehose`` (a 16 KiB ring written fast, so
  a stopped reader is lapped) and ``mixed`` (random sizes up to ~100 KB, random
  bursts and pauses). Every message carries (epoch, sequence number, length,
  CRC-32) and random bytes; the epoch changes when a publisher restarts;
- msgq subscribers (plain and conflating) that check every message;
- a VisionIPC server publishing stamped frames (every byte of frame N encodes
  N) and clients (plain, conflating, and a conflating "holder" that keeps each
  frame leased for 50 ms, so a kill lands mid-frame).

Faults, in shuffled rounds so each kind happens: SIGKILL a subscriber, a
client mid-frame, a publisher, the server (the last two are restarted);
SIGSTOP a subscriber of the firehose for longer than its ring lasts, then
SIGCONT; SIGSTOP a client holding a lease.

Checks at the end (any failure: exit status 1 and the reasons):
- every message a subscriber got was intact (length, CRC) and in order;
  every gap in a plain subscriber's sequence coincides with a counted reset
  (``sub.resets``); conflating subscribers may skip, never go back;
- every valid frame a client got was intact; frames never went back in a
  server's sequence; a frame overwritten under a reader was reported invalid;
- no hang: every process stops within 20 s when asked; no survivor crashed;
- restarted publishers / servers were picked up: each surviving reader's last
  message came from the final publisher incarnation;
- reader slots reclaimed: no live reader slot remains once subscribers have
  left, and each final publisher reports 0 readers after reclaiming the dead;
  the server's lease slots all freed (0 clients);
- nothing leaked: no segment file of the run's MSGQ_PREFIX left in the shm
  directory, no file descriptor left open in a child that closed its sockets.

    python tools/soak.py --seconds 300           # the full soak (prints totals)
    python tools/soak.py --seconds 45 --json out.json   # what tests/system/test_soak.py runs
"""

from .runner import main

__all__ = ["main"]
