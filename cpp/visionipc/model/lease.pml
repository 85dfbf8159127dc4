/*
 * A Promela model of VisionIPC's read leases and the producer's probe
 * (cpp/visionipc/server.cc get_buffer / leased, client.cc take_lease), with the
 * producer reading only the lease slots of admitted clients (slot_used, issue 36).
 *
 * Shared memory, sequentially consistent as the code's seq_cst accesses make it
 * (Promela interleaving; each transition makes at most one shared access):
 *   meta[i]     buffer i's generation word in the pool: even = published,
 *               odd = checked out by the producer, + PROBE while it probes
 *   lease[c]    client c's lease slot: 0, or WORD(i, g)
 *   slot_used   bit c set while client c is admitted (the listener's RMW)
 *   replied[c]  the admission reply has reached client c
 * Producer (one thread: get_buffer then send, SENDS times): pick a published,
 * unleased-looking buffer i at generation g; G1a: store g+PROBE, load
 * slot_used, read the lease slot of each bit set; a match hands it back
 * (store g), else G1b: store g+1 (writing), G3: store g+2 (published).
 * Listener: admits each client: A (set its bit), then the reply.
 * Client c (after its reply), FRAMES times: takes the newest announced
 * generation g of some buffer i; L1: lease[c] = WORD(i, g); R: re-read meta[i]:
 * g is a held frame, g+PROBE makes it read again (the producer decides in a
 * few instructions), anything else is a lost frame (L1 undone). A held frame
 * is read twice, then released (L2).
 *
 * Property: a frame a client holds is never written: while it holds (i, g),
 * meta[i] stays g or g+PROBE (asserted at each read of the frame).
 *
 * Mutations (spin -DNAME -a lease.pml), each must have a counterexample:
 *   REPLY_BEFORE_BIT  the listener replies before it sets the client's bit
 *   MASK_BEFORE_PROBE the producer loads slot_used before its probe store
 *                     (a mask kept from an earlier look)
 *   NO_RECHECK        the producer checks the leases before the probe only
 */

#define NB 3                    /* buffers */
#define NC 2                    /* clients */
#ifndef SENDS
#define SENDS 3                 /* frames the producer publishes (-DSENDS=4: 27 M states, 33 s) */
#endif
#define FRAMES 2                /* frames each client takes */
#define PROBE 64
#define WORD(i, g) ((i) * 16 + (g) + 1)   /* nonzero; g < 16 here */

byte meta[NB];
byte lease[NC];
byte slot_used = 0;
bool replied[NC];
byte newest[NB];                /* the generation last announced for each buffer */

proctype listener() {
  byte c = 0;
  do
  :: c < NC ->
#ifdef REPLY_BEFORE_BIT
     replied[c] = true;
     slot_used = slot_used | (1 << c);
#else
     slot_used = slot_used | (1 << c);   /* A: fetch_or, seq_cst */
     replied[c] = true;
#endif
     c++
  :: else -> break
  od
}

/* Whether any admitted slot in `mask` holds WORD(i, g); one slot a step. */
inline any_lease(mask, i, g, found) {
  k = 0;
  found = false;
  do
  :: k < NC && !found ->
     if
     :: (mask & (1 << k)) && lease[k] == WORD(i, g) -> found = true
     :: else -> skip
     fi;
     k++
  :: else -> break
  od
}

proctype producer() {
  byte sent = 0, i, g, mask, k;
  bool found;
  do
  :: sent < SENDS ->
     /* the least recently sent buffer, or any: every choice is explored */
     if
     :: i = 0
     :: i = 1
     :: i = 2
     fi;
     g = meta[i];
     if
     :: g % 2 == 1 -> skip          /* checked out: not a candidate */
     :: else ->
#ifdef MASK_BEFORE_PROBE
        mask = slot_used;
#endif
        /* the first look, before the probe (skips a buffer that is plainly leased) */
#ifndef MASK_BEFORE_PROBE
        mask = slot_used;
#endif
        any_lease(mask, i, g, found);
        if
        :: found -> skip
        :: else ->
#ifndef NO_RECHECK
           meta[i] = g + PROBE;      /* G1a: probe */
#ifndef MASK_BEFORE_PROBE
           mask = slot_used;         /* M: after the probe */
#endif
           any_lease(mask, i, g, found);
#endif
           if
           :: found -> meta[i] = g  /* a lease appeared: hand it back untouched */
           :: else ->
              meta[i] = g + 1;       /* G1b: checked out, the producer writes */
              meta[i] = g + 2;       /* G3: published */
              newest[i] = g + 2;
              sent++
           fi
        fi
     fi
  :: else -> break
  od
}

proctype client(byte c) {
  byte taken = 0, i, g, r;
  replied[c] == true;             /* the admission reply: only then the fds and the first frame */
  do
  :: taken < FRAMES ->
     if
     :: i = 0
     :: i = 1
     :: i = 2
     fi;
     g = newest[i];
     if
     :: g == 0 -> skip              /* nothing announced for it yet */
     :: else ->
        lease[c] = WORD(i, g);      /* L1 */
reread:
        r = meta[i];                /* R */
        if
        :: r == g ->
           assert(meta[i] == g || meta[i] == g + PROBE);   /* reading the frame */
           assert(meta[i] == g || meta[i] == g + PROBE);
           lease[c] = 0             /* L2 */
        :: r == g + PROBE -> goto reread
        :: else -> lease[c] = 0     /* lost: the buffer moved on */
        fi;
        taken++
     fi
  :: else -> break
  od
}

init {
  atomic {
    run listener();
    run producer();
    run client(0);
    run client(1)
  }
}
