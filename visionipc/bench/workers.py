"""A pool of persistent, CPU-pinned ``spawn`` worker processes that run task
functions in lockstep: a task calls ``ctl.barrier(tag)`` and continues only once
every worker of the task got there (the parent relays the barrier over pipes;
no sleeps as synchronisation). Task functions must be importable by name
(module-level functions of an installed module), since workers are spawned."""

import multiprocessing
import multiprocessing.connection
import os
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

State = Dict[str, Any]  # a worker's: "index", "cpu", and what ``setup`` put there
Task = Callable[..., Any]  # fn(ctl, state, **kwargs): a module-level function (workers are spawned)
Hook = Optional[Callable[[State], None]]  # setup / teardown of a worker's state


class BenchError(RuntimeError):
    pass


def usable_cpus() -> List[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def pin_to(cpu: Optional[int]) -> bool:
    """Pin the calling thread (and the threads it starts later) to ``cpu``."""
    if cpu is None:
        return False
    try:
        os.sched_setaffinity(0, {cpu})
        return True
    except (AttributeError, OSError):
        return False


def read_loadavg() -> Optional[List[str]]:
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[:3]
    except OSError:
        return None


class Control:
    """What a task function gets to synchronise with the other workers."""

    def __init__(self, conn: Connection, index: int) -> None:
        self._conn = conn
        self.index = index

    def barrier(self, tag: str) -> None:
        self._conn.send(("barrier", tag))
        msg = self._conn.recv()
        if msg != ("go", tag):
            raise BenchError(f"worker {self.index}: expected go for barrier {tag!r}, got {msg!r}")


def _worker_main(conn: Connection, index: int, cpu: Optional[int], setup: Hook, teardown: Hook) -> None:
    pinned = pin_to(cpu)
    state: State = {"index": index, "cpu": cpu if pinned else None}
    if setup is not None:
        setup(state)
    ctl = Control(conn, index)
    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                break
            if msg[0] == "stop":
                break
            _, fn, kwargs = msg
            try:
                result = fn(ctl, state, **kwargs)
            except BaseException:  # report everything, the parent decides
                conn.send(("error", traceback.format_exc()))
            else:
                conn.send(("result", result))
    finally:
        if teardown is not None:
            teardown(state)


class WorkerPool:
    """``len(cpus)`` worker processes, worker ``i`` pinned to ``cpus[i]`` (None: unpinned)."""

    def __init__(self, cpus: Iterable[Optional[int]], setup: Hook = None, teardown: Hook = None) -> None:
        self._cpus = list(cpus)
        self._setup, self._teardown = setup, teardown
        self._ctx = multiprocessing.get_context("spawn")
        self._procs: List[Any] = []  # the spawn context's Process objects
        self._conns: List[Connection] = []
        self._start()

    def _start(self) -> None:
        for i, cpu in enumerate(self._cpus):
            parent, child = self._ctx.Pipe()
            p = self._ctx.Process(
                target=_worker_main,
                args=(child, i, cpu, self._setup, self._teardown),
                name=f"bench-worker-{i}",
                daemon=True,
            )
            p.start()
            child.close()
            self._procs.append(p)
            self._conns.append(parent)

    @property
    def pids(self) -> List[Optional[int]]:
        return [p.pid for p in self._procs]

    @property
    def size(self) -> int:
        return len(self._cpus)

    def run(self, tasks: Sequence[Optional[Tuple[Task, Dict[str, Any]]]], timeout: float) -> List[Any]:
        """Run ``tasks[i] = (fn, kwargs)`` on worker ``i`` (None: idle) and return
        their results. Raises BenchError (after restarting the pool) when a task
        fails or the whole thing takes over ``timeout`` s."""
        active = [i for i, t in enumerate(tasks) if t is not None]
        for i in active:
            fn, kwargs = tasks[i]  # type: ignore[misc]  # active: the tasks that are not None
            self._conns[i].send(("run", fn, kwargs))
        results: Dict[int, Any] = {}
        waiting: Dict[int, str] = {}  # worker -> the barrier it waits at
        deadline = time.monotonic() + timeout
        try:
            while len(results) < len(active):
                pending = [self._conns[i] for i in active if i not in results]
                ready: List[Any] = multiprocessing.connection.wait(
                    pending, timeout=max(0.0, deadline - time.monotonic())
                )
                if not ready:
                    raise BenchError(f"task timed out after {timeout:.0f} s (barriers reached: {waiting})")
                for conn in ready:
                    i = self._conns.index(conn)
                    try:
                        kind, payload = conn.recv()
                    except EOFError:
                        raise BenchError(f"worker {i} died (exit code {self._procs[i].exitcode})") from None
                    if kind == "error":
                        raise BenchError(f"worker {i} failed:\n{payload}")
                    if kind == "result":
                        results[i] = payload
                        waiting.pop(i, None)
                    elif kind == "barrier":
                        waiting[i] = payload
                    live = [j for j in active if j not in results]
                    if live and all(j in waiting for j in live):
                        tags = {waiting[j] for j in live}
                        if len(tags) != 1:
                            raise BenchError(f"workers at different barriers: {waiting}")
                        tag = tags.pop()
                        for j in live:
                            self._conns[j].send(("go", tag))
                        waiting.clear()
        except BaseException:
            self.restart()
            raise
        return [results.get(i) for i in range(len(tasks))]

    def restart(self) -> None:
        self.close(graceful=False)
        self._start()

    def close(self, graceful: bool = True) -> None:
        for conn, p in zip(self._conns, self._procs):
            if graceful and p.is_alive():
                try:
                    conn.send(("stop",))
                except (BrokenPipeError, OSError):
                    pass
        for conn, p in zip(self._conns, self._procs):
            p.join(timeout=5 if graceful else 0.2)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
            conn.close()
        self._procs, self._conns = [], []
