/*
 * A Promela model of the wait point (cpp/common/wait_point.h): a futex word
 * whose bit 0 says "someone may be asleep here", two notifiers that each make
 * a condition true K times (the count `cond` grows) and notify, two waiters
 * that each wait for cond >= 1, then >= 2, ... up to 2K without a timeout.
 *
 * Memory is sequentially consistent (Promela interleaving): the seq_cst
 * fence after the waiter's fetch_or and the one before the notifier's load
 * give exactly the Dekker ordering modelled here. Each transition makes at
 * most one access to shared memory; the futex system calls are atomic as the
 * kernel makes them (FUTEX_WAIT compares the word and queues the caller under
 * the bucket lock; FUTEX_WAKE dequeues every queued waiter).
 *
 * Property: no lost wake-up. A waiter asleep while its condition holds, with
 * every notifier finished, is an invalid end state (spin reports it); each
 * waiter asserts at its end that it saw every notification.
 *
 * Mutations (spin -DNAME -a wait_point.pml), each must have a counterexample:
 *   NO_RECHECK      the waiter sleeps without checking the condition after
 *                   registering its bit
 *   LOAD_FIRST      the notifier loads the word before making the condition
 *                   true (the reorder its seq_cst fence forbids)
 *   WAKE_ONE        FUTEX_WAKE wakes one sleeper, not all (the bit is cleared
 *                   for everybody, so the others must all wake)
 *   KEEP_OLD_WORD   the notifier clears the bit without changing the
 *                   generation: a waiter between its check and FUTEX_WAIT
 *                   then sleeps on a word that looks unchanged
 * Option: RETRY makes a notifier that loses the compare-and-swap look at the
 * word again (verifies too: giving up, as wait_point.h does, is enough).
 */

#ifndef K
#define K 2                   /* notifications per notifier */
#endif
#define NW 2                  /* waiters */

byte word = 0;                /* bit 0: may sleep; bits 1..: generation */
byte cond = 0;                /* the condition's state: notifications made */
bool asleep[NW];              /* queued in FUTEX_WAIT */
byte seen[NW];                /* highest cond each waiter returned for */

#define MAY_SLEEP(w)  ((w) % 2 == 1)
#define CLEARED(w)    ((w) - (w) % 2 + 2)

inline futex_wake_all() {
#ifdef WAKE_ONE
  atomic {
    if
    :: asleep[0] -> asleep[0] = false
    :: else -> asleep[1] = false
    fi
  }
#else
  atomic { asleep[0] = false; asleep[1] = false }
#endif
}

proctype notifier() {
  byte w, i = 0;
  do
  :: i < K ->
#ifdef LOAD_FIRST
    w = word;                                  /* N3 hoisted above N1 */
    cond++;                                    /* N1 make the condition true */
#else
    cond++;                                    /* N1 make the condition true */
    /* N2 seq_cst fence */
    w = word;                                  /* N3 load the word */
#endif
    do
    :: !MAY_SLEEP(w) -> break                  /* N4 nobody may sleep: no syscall */
    :: else ->
      atomic {                                 /* N5 CAS w -> cleared, generation + 1 */
        if
#ifdef KEEP_OLD_WORD
        :: word == w -> word = w - 1; w = 255
#else
        :: word == w -> word = CLEARED(w); w = 255
#endif
#ifdef RETRY
        :: else -> w = word                    /* lost the race: look again */
#else
        :: else -> w = 0                       /* lost the race: the winner wakes (wait_point.h) */
#endif
        fi
      }
      if
      :: w == 255 -> futex_wake_all(); break   /* N6 we cleared it: wake everybody */
      :: else -> skip
      fi
    od;
    i++
  :: else -> break
  od
}

proctype waiter(byte me) {
  byte w, target = 1;
  do
  :: target > 2 * K -> break
  :: else ->
    if
    :: cond >= target -> skip                  /* ready at once */
    :: else ->
      do
      :: atomic { w = word | 1; word = w }     /* S1 fetch_or(1) */
         /* S2 seq_cst fence */
#ifndef NO_RECHECK
         if
         :: cond >= target -> break            /* S3 the condition, after registering */
         :: else -> skip
         fi;
#endif
         atomic {                              /* S4 FUTEX_WAIT(word, w) */
           if
           :: word == w -> asleep[me] = true
           :: else -> skip                     /* EAGAIN */
           fi
         }
         !asleep[me];                          /* S5 until woken */
         if
         :: cond >= target -> break            /* S6 woken: check again */
         :: else -> skip
         fi
      od
    fi;
    assert(cond >= target);
    seen[me] = target;
    target++
  od;
  assert(seen[me] == 2 * K)
}

init {
  atomic {
    run notifier(); run notifier();
    run waiter(0); run waiter(1)
  }
}
