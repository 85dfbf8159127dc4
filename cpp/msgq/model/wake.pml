/*
 * A Promela model of how msgq readers sleep and the writer wakes them
 * (cpp/msgq/subscriber.cc Subscriber::wait, cpp/msgq/publisher.cc
 * Publisher::wake_readers), with both wake modes:
 *
 *   all      the writer wakes every sleeper with one FUTEX_WAKE(INT_MAX)
 *   handoff  (-DHANDOFF) with two or more bits in sleeping_mask the writer
 *            sets handoff_pending and wakes ONE sleeper; the reader it wakes
 *            takes the flag (exchange 0) and wakes the others
 *            (FUTEX_WAKE(INT_MAX)), so the writer's cost does not grow with
 *            the number of readers; with one bit it wakes all, as "all" does
 *
 * The writer sends MSGS messages (write_pointer counts them); NR readers each
 * wait for every message in turn without a timeout. Memory is sequentially
 * consistent (the C++ uses seq_cst for write_pointer, sleeping_mask and the
 * reader's final check: the Dekker pair); the futex calls are atomic as the
 * kernel makes them (FUTEX_WAIT compares the word and queues the caller under
 * the bucket lock; FUTEX_WAKE(1) dequeues one queued waiter, any of them).
 * -DSPURIOUS lets each sleeper return from FUTEX_WAIT on its own once, at any
 * time (a signal, a timeout, a spurious wake-up): it must still lose nothing
 * (once, so that a reader left asleep for good is still an invalid end state).
 * -DKILL lets reader 0 die (or not) right after a FUTEX_WAKE dequeued it, before it
 * could hand the wake-up on (SIGKILL at the worst instant), for any message
 * but the last: the others must still receive every message (the next
 * message's wake-up reaches them, as the sleeping bits stay set).
 *
 * Property: no lost wake-up. A reader asleep with its message written and the
 * writer finished is an invalid end state (spin reports it); each reader
 * asserts at its end that it received every message.
 *
 * Mutations, each must have a counterexample (with -DHANDOFF):
 *   NO_PASS_ON      the woken reader does not wake the others
 *   FLAG_AFTER_WAKE the writer sets handoff_pending after its FUTEX_WAKE(1):
 *                   the woken reader may look before it is set
 *   FLAG_BEFORE_BUMP the writer sets it before its fetch_add of futex_seq: a
 *                   reader on its way out of an earlier sleep takes it and
 *                   wakes everybody before a late sleeper queues on the old
 *                   value, and the one the writer then wakes finds no flag
 *   CLEAR_MASK      the writer clears sleeping_mask when it wakes: a reader
 *                   left asleep by a killed leader is never woken again (-DKILL)
 */

#ifndef MSGS
#define MSGS 2
#endif
#define NR 3

byte write_pointer = 0;       /* messages committed */
byte futex_seq = 0;           /* the futex word (wraps harmlessly in the model) */
byte sleeping_mask = 0;       /* bit i: reader i may sleep */
bool handoff_pending = false; /* the writer woke one sleeper for everybody */
bool asleep[NR];              /* queued in FUTEX_WAIT */
byte received[NR];
bool dead[NR];
bool strayed[NR];             /* SPURIOUS: this reader's one early return is used */

#define BIT(i) (1 << (i))
#define SEVERAL(m) ((m) & ((m) - 1))   /* two or more bits: (sleeping & (sleeping - 1)) != 0 */

inline futex_wake_all() {
  atomic { asleep[0] = false; asleep[1] = false; asleep[2] = false }
}

inline futex_wake_one() {
  atomic {
    if
    :: asleep[0] -> asleep[0] = false
    :: asleep[1] -> asleep[1] = false
    :: asleep[2] -> asleep[2] = false
    :: else -> skip
    fi
  }
}

proctype writer() {
  byte m = 0, seen;
  do
  :: m < MSGS ->
    write_pointer++;                               /* W3 commit (seq_cst) */
    if
    :: sleeping_mask != 0 ->                       /* load sleeping_mask (seq_cst) */
      seen = sleeping_mask;
#ifdef CLEAR_MASK
      sleeping_mask = 0;
#endif
#if defined(HANDOFF) && defined(FLAG_BEFORE_BUMP)
      if
      :: SEVERAL(seen) -> handoff_pending = true
      :: else -> skip
      fi;
#endif
      futex_seq++;                                 /* fetch_add(1) */
#ifdef HANDOFF
      if
      :: SEVERAL(seen) ->
#if !defined(FLAG_AFTER_WAKE) && !defined(FLAG_BEFORE_BUMP)
        handoff_pending = true;                    /* after the bump, before the wake */
#endif
        futex_wake_one();
#ifdef FLAG_AFTER_WAKE
        handoff_pending = true;
#endif
        skip
      :: else -> futex_wake_all()                  /* one sleeper: wake it directly */
      fi
#else
      futex_wake_all()
#endif
      ;
      seen = 0                                     /* a register: forgotten (fewer states) */
    :: else -> skip                                /* nobody sleeps: no syscall */
    fi;
    m++
  :: else -> break
  od
}

proctype reader(byte me) {
  byte seq, target = 1;
  bool taken;
  do
  :: target > MSGS -> break
  :: else ->
    if
    :: write_pointer >= target -> skip             /* data at once */
    :: else ->
      do
      :: atomic { sleeping_mask = sleeping_mask | BIT(me) }   /* fetch_or (seq_cst) */
         seq = futex_seq;                                     /* load futex_seq */
         if
         :: write_pointer >= target ->                        /* final check (seq_cst) */
            atomic { sleeping_mask = sleeping_mask & ~BIT(me) };
            break
         :: else -> skip
         fi;
         atomic {                                             /* FUTEX_WAIT(futex_seq, seq) */
           if
           :: futex_seq == seq -> asleep[me] = true
           :: else -> skip                                    /* EAGAIN */
           fi
         }
#ifdef SPURIOUS
         if
         :: !asleep[me] -> skip                               /* woken (or never slept) */
         :: atomic { asleep[me] && !strayed[me] ->            /* once: a signal, a timeout, */
              asleep[me] = false; strayed[me] = true }        /* a spurious return */
         fi;
#else
         !asleep[me];                                         /* until woken */
#endif
#ifdef KILL
         if
         :: me == 0 && write_pointer >= target && write_pointer < MSGS ->
            dead[me] = true;                                  /* killed before handing on */
            goto gone
         :: true -> skip                                      /* or not: both are explored */
         fi;
#endif
         atomic { sleeping_mask = sleeping_mask & ~BIT(me) }  /* fetch_and */
         if
         :: write_pointer >= target ->
#ifdef HANDOFF
#ifndef NO_PASS_ON
            atomic { taken = handoff_pending; handoff_pending = false };  /* exchange(0) */
            if
            :: taken -> futex_wake_all()
            :: else -> skip
            fi;
#endif
#endif
            break
         :: else -> skip
         fi
      od
    fi;
    assert(write_pointer >= target);
    received[me] = target;
    target++
  od;
  assert(received[me] == MSGS);
gone:
  skip
}

init {
  atomic {
    run writer();
    run reader(0); run reader(1); run reader(2)
  }
}
