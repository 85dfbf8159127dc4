/*
 * A Promela model of the MSGQ ring (cpp/msgq/README.md, cpp/msgq/ring.h):
 * one writer (W1..W3 and the wrap), two readers (R1..R5, reset X1..X3), a
 * ring of N one-word slots; one model word stands for 8 bytes of the ring.
 * README.md beside this file maps every label to its step and ring.h line.
 *
 * Memory is sequentially consistent (Promela interleaving). Each transition
 * makes at most one access to shared memory; atomic { } only groups that
 * access with local bookkeeping. The C++ fences and seq_cst accesses that give
 * each ordering the model relies on are named in the comments.
 *
 * Properties (assert): a reader that passes R5 holds an untorn message (every
 * payload word equals the sequence number of the message whose size prefix it
 * read); each reader delivers strictly increasing sequence numbers; every
 * array index is checked before it is used.
 *
 * Mutations, one file for all (spin -DNAME -a ring.pml); README.md lists
 * which combinations have a counterexample and which verify:
 *   NO_R2          no validity check after the size (fails only together with
 *                  NO_SIZE_CHECK: the seed spec's reader, whose only guard
 *                  against a garbage size is R2)
 *   NO_SIZE_CHECK  the size is trusted (ring.h bounds-checks it and resets)
 *   NO_R5          no validity re-check after the copy
 *   NO_W1          the writer never clears a validity flag
 *   R2_BEFORE_R1   the reorder that the acquire fence after R1 forbids (fails
 *                  with NO_SIZE_CHECK)
 *   R5_BEFORE_R3   the reorder that the acquire fence after R4 forbids
 *   W2_BEFORE_W1   the reorder that the release fence ending W1 forbids
 *   W3_BEFORE_W2   the reorder that the release in W3's write_pointer store forbids
 *   R1_BEFORE_R0   the reorder that the acquire load of write_pointer forbids
 *   NO_X3_RECHECK  reset does not re-load the writer's cycle after X3 (verifies)
 * Options: CONFLATE makes reader 1 a conflating reader (reads only the
 * newest message; resets onto last_message); MSGS=n messages (default 3).
 */

#define N        8                    /* ring words; word N-1 is the spare word (kSpareBytes) */
#define NR       2                    /* readers */
#ifndef MSGS
#define MSGS     3                    /* messages the writer sends, then it stops */
#endif
/* Sequence numbers FIRST .. FIRST+MSGS-1. Starting at 4 makes a payload word
 * misread as a size prefix sometimes fit in the ring and sometimes not, as
 * real garbage would. */
#define FIRST    4
#define MAXPAY   ((N - 1) / 2 - 1)    /* max_message_size() in words: 2 */
#define WRAP     (-1)                 /* kWrapMarker */

/* pack(cycle, offset): one variable, so it is loaded and stored atomically. */
#define PACK(c, o)  ((c) * N + (o))
#define CYC(p)      ((p) / N)
#define OFF(p)      ((p) % N)

/* --- shared memory (layout.h) --- */
short data[N];                        /* the data ring: size prefixes, -1 markers, payload */
short write_pointer = 0;              /* SegmentHeader::write_pointer */
#ifdef CONFLATE
short last_message = 0;               /* SegmentHeader::last_message */
#endif
short read_pointer[NR];               /* ReaderSlot::read_pointer */
bit   valid[NR];                      /* ReaderSlot::valid */

/* --- ghost: observation only, never read by the protocol --- */
byte  owner[N];                       /* seq of the message whose size prefix is data[i], else 0 */

/* Is a reader at rpl safe from a write of [o, o + n) in cycle c? (W1) */
#define SAFE(rpl, c, o, n) \
  ((CYC(rpl) == (c) && OFF(rpl) <= (o)) ||             /* same cycle, at or behind */ \
   (CYC(rpl) == (c) - 1 && OFF(rpl) >= (o) + (n)))     /* one cycle behind, past the area */

/* W1 for reader r: load its read pointer, clear its flag if it is not safe. */
inline invalidate_one(r, c, o, n) {
  atomic { clear = !SAFE(read_pointer[r], c, o, n) };  /* seq_cst load */
#ifndef NO_W1
  atomic { if :: clear -> valid[r] = 0 :: else -> skip fi; clear = 0 }  /* relaxed store */
#else
  clear = 0
#endif
}

/* W1 (RingWriter::invalidate_readers), then the release fence. */
inline invalidate(c, o, n) {
  invalidate_one(0, c, o, n);
  invalidate_one(1, c, o, n)
}

/* W2: the payload, one word at a time; every word holds the sequence number. */
inline write_payload() {
  k = 1;
  do
  :: k <= size ->
       assert(off + k < N - 1);
       d_step { data[off + k] = seq; owner[off + k] = 0; k++ }
  :: else -> k = 0; break
  od
}

proctype Writer() {
  byte seq = FIRST, size, k;
  short cyc = 0, off = 0;             /* RingWriter::wp_ */
  bit clear;

  do
  :: seq == FIRST + MSGS -> break
  :: else ->
       if                             /* any payload size up to max_message_size() */
       :: size = 1
       :: size = 2
       fi;
       assert(1 <= size && size <= MAXPAY);
       if
       :: off + 1 + size > N - 1 ->   /* reserve(): it does not fit before the spare word */
wrap_W1:    invalidate(cyc, off, N - off);
            assert(off < N);
wrap_mark:  d_step { data[off] = WRAP; owner[off] = 0 };           /* store_prefix(-1) */
wrap_pub:   atomic { cyc++; off = 0; write_pointer = PACK(cyc, 0) } /* seq_cst store */
       :: else -> skip
       fi;
#if defined(W3_BEFORE_W2)
W1:    invalidate(cyc, off, 1 + size);
W3:    d_step { data[off] = size; owner[off] = seq };
#ifdef CONFLATE
W3_last: last_message = PACK(cyc, off);
#endif
W3_pub: write_pointer = PACK(cyc, off + 1 + size);
W2:    write_payload();
       atomic { off = off + 1 + size; seq++; size = 0 }
#else
#if defined(W2_BEFORE_W1)
W2:    write_payload();
W1:    invalidate(cyc, off, 1 + size);
#else
W1:    invalidate(cyc, off, 1 + size);
       /* release fence: the cleared flags are ordered before W2's stores */
W2:    write_payload();
#endif
W3:    assert(off < N - 1);
       d_step { data[off] = size; owner[off] = seq };   /* store_prefix(n), relaxed */
#ifdef CONFLATE
W3_last: last_message = PACK(cyc, off);               /* relaxed, released by W3_pub */
#endif
W3_pub: atomic { off = off + 1 + size; write_pointer = PACK(cyc, off); seq++; size = 0 }  /* seq_cst */
#endif
  od
}

proctype Reader(byte me; bit conflate) {
  short rp = 0;                 /* RingReader::rp_ */
  short at;                     /* rp_ when the message was read: R5 failure restores it */
  short wpl, size, newest, consumed;
  byte pseq, last = 0, k;       /* pseq: ghost, owner of the prefix read at R1 */
  short got;                    /* the sink (prepare(size)): its first word, */
  bit mixed;                    /* and whether any other word differs from it */

  goto reset;                   /* Subscriber::claim_slot: in reader_mask, then reset() */

read:                           /* RingReader::read(), loop top */
  if                            /* lapped? acquire load */
  :: valid[me] == 0 && conflate -> goto reset_to_newest
  :: valid[me] == 0 && !conflate -> goto reset
  :: else -> skip
  fi;
#ifdef R1_BEFORE_R0
R1: atomic { at = rp; assert(OFF(at) < N); size = data[OFF(at)]; pseq = owner[OFF(at)] };
#endif
R0: atomic {                    /* acquire load; equal to rp_: no message */
    wpl = write_pointer;
    if
    :: wpl == rp -> wpl = 0; size = 0; pseq = 0; goto read
    :: else -> at = rp; if :: !conflate -> wpl = 0 :: else -> skip fi
    fi
  };
#ifdef R2_BEFORE_R1
R2: if :: valid[me] == 0 -> goto read :: else -> skip fi;
#endif
#ifndef R1_BEFORE_R0
    /* acquire load of write_pointer: the prefix is read after it (R0 before R1) */
R1: atomic { assert(OFF(at) < N); size = data[OFF(at)]; pseq = owner[OFF(at)] };   /* load_prefix, relaxed */
#endif
    /* acquire fence: R1 is ordered before R2 */
#if !defined(NO_R2) && !defined(R2_BEFORE_R1)
R2: if :: valid[me] == 0 -> goto read :: else -> skip fi;     /* relaxed load */
#endif
  if
  :: size == WRAP ->            /* -1 replaces R3/R4: next cycle, offset 0 */
R4_wrap: atomic { rp = PACK(CYC(at) + 1, 0); read_pointer[me] = rp; size = 0; pseq = 0 }
       goto read
  :: else -> skip
  fi;
#ifndef NO_SIZE_CHECK
size_check:
  if                            /* corrupted() -> lapped(false) -> reset() */
  :: size < 0 || OFF(at) + 1 + size > N - 1 -> goto reset
  :: else -> skip
  fi;
#endif
is_newest:
  if
  :: conflate ->                /* is_newest(): deliver only the newest message */
       if
       :: at + 1 + size == wpl -> skip
       :: at + 1 + size != wpl && wpl == PACK(CYC(at) + 1, 0) ->
            assert(OFF(at) + 1 + size < N);
            /* the -1 right after it? load_prefix, acquire fence, then the flag */
            if
            :: data[OFF(at) + 1 + size] == WRAP -> skip
            :: else -> goto skip_message
            fi;
            if
            :: valid[me] != 0 -> skip
            :: else -> goto skip_message
            fi
       :: else -> goto skip_message
       fi;
       wpl = 0
  :: else -> skip
  fi;
#ifdef R5_BEFORE_R3
R5: if :: valid[me] == 0 -> rp = at; goto read :: else -> skip fi;
#endif
R3:                             /* ring_copy into the sink, one word at a time */
  k = 0;
  do
  :: k < size ->
       assert(OFF(at) + 1 + k < N);
       d_step {
         if
         :: k == 0 -> got = data[OFF(at) + 1]
         :: else -> mixed = mixed || data[OFF(at) + 1 + k] != got
         fi;
         k++
       }
  :: else -> k = 0; break
  od;
R4: atomic { rp = at + 1 + size; read_pointer[me] = rp }  /* advance(next), release store */
    /* acquire fence: the copy (R3) is ordered before R5 */
#if !defined(NO_R5) && !defined(R5_BEFORE_R3)
R5: if
    :: valid[me] == 0 ->        /* maybe torn: discard, rp_ back to the message */
         atomic { rp = at; size = 0; pseq = 0; got = 0; mixed = 0 }
         goto read
    :: else -> skip
    fi;
#endif
delivered:                      /* the properties */
  d_step {
    assert(pseq != 0 && 1 <= size && size <= MAXPAY);  /* a real message's prefix */
    assert(got == pseq && !mixed);                     /* untorn, and from that message */
    assert(pseq > last);                               /* in order, no duplicates */
    last = pseq;
    size = 0; pseq = 0; got = 0; mixed = 0; at = 0
  };
  goto read;

skip_message:                   /* conflate: advance(next) without copying */
  atomic { rp = at + 1 + size; read_pointer[me] = rp; size = 0; pseq = 0; wpl = 0; at = 0 }
  goto read;

reset_to_newest:                /* RingReader::reset_to_newest (conflate only) */
#ifdef CONFLATE
  consumed = rp;
  do
  :: valid[me] = 1;                                   /* X1, seq_cst */
     wpl = write_pointer;                             /* seq_cst load */
     newest = last_message;                           /* relaxed load */
     if
     :: CYC(newest) < CYC(wpl) -> goto reset          /* nothing committed in this cycle yet */
     :: CYC(newest) > CYC(wpl) ||
        (CYC(newest) == CYC(wpl) && OFF(newest) >= OFF(wpl)) -> skip   /* newer than wpl: again */
     :: CYC(newest) == CYC(wpl) && OFF(newest) < OFF(wpl) ->
          if
          :: newest < consumed -> goto reset          /* precedes(): already delivered */
          :: else ->
               atomic { rp = newest; read_pointer[me] = rp }   /* publish_position, seq_cst */
#ifndef NO_X3_RECHECK
               if
               :: CYC(write_pointer) == CYC(newest) ->          /* seq_cst load */
                    atomic { wpl = 0; newest = 0; consumed = 0 }
                    goto read
               :: else -> skip                                  /* the writer changed cycle: again */
               fi
#else
               atomic { wpl = 0; newest = 0; consumed = 0 }
               goto read
#endif
          fi
     fi
  od;
#endif

reset:                          /* RingReader::reset */
  atomic { wpl = 0; newest = 0; consumed = 0; size = 0; pseq = 0; at = 0 };
  do
  :: true ->
X1: valid[me] = 1;                                    /* seq_cst store */
X2: wpl = write_pointer;                              /* seq_cst load */
X3: atomic { rp = wpl; read_pointer[me] = rp };       /* publish_position, seq_cst store */
#ifndef NO_X3_RECHECK
X3_recheck:
    if
    :: CYC(write_pointer) == CYC(wpl) -> wpl = 0; goto read   /* seq_cst load */
    :: else -> skip                                   /* the writer changed cycle: again */
    fi
#else
    wpl = 0; goto read
#endif
  od
}

init {
  atomic {
    run Writer();
    run Reader(0, 0);
#ifdef CONFLATE
    run Reader(1, 1)
#else
    run Reader(1, 0)
#endif
  }
}
