"""One skeleton for the pub/sub benchmark suites (``suites.msgq_vs_zmq``, ``suites.zmq_backend``):
a :class:`Plan` of what to measure, a :class:`Runner` that runs each measurement's tasks
in the pinned worker pool and keeps its record, the records picked for the summary
(:func:`select`), and :class:`Suite`, whose ``main`` is the command: the flags, the run,
the report. A suite says what differs: its flags, plan, runner, summary and table."""

import argparse
import contextlib
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Type

from visionipc.bench import harness
from visionipc.bench.stats import fmt_size
from visionipc.bench.workers import BenchError, WorkerPool

Record = Dict[str, Any]  # one measurement: its kind, variant, size, round and numbers


class Plan:
    """What one run measures: ``rounds`` (0: 1 with ``quick``, else the suite's
    ``default_rounds``), the message ``sizes`` and the parts ``only`` names (none: all)."""

    default_rounds = 2

    def __init__(self, quick: bool, rounds: int, sizes: List[int], only: Set[str]) -> None:
        self.quick = quick
        self.rounds = rounds or (1 if quick else self.default_rounds)
        self.sizes = sizes
        self.only = only

    def wants(self, part: str) -> bool:
        return not self.only or part in self.only


class Runner:
    """Runs measurements in ``pool``: the records of those that ran in ``results``,
    those that failed (with their ``error``) in ``errors``."""

    def __init__(self, pool: WorkerPool, plan: Plan, log: harness.Log) -> None:
        self.pool, self.plan, self.log = pool, plan, log
        self.results: List[Record] = []
        self.errors: List[Record] = []

    def run_tasks(self, record: Record, tasks: Sequence[Any], timeout: float) -> Optional[List[Any]]:
        """The results of ``tasks`` (``pool.run``), or None when they failed: the
        record then joins ``errors`` with the error, and a progress line says so."""
        try:
            return self.pool.run(tasks, timeout)
        except BenchError as e:
            self.log(f"  {self.failure_label(record)}: {str(e).splitlines()[-1]}")
            record["error"] = str(e)
            self.errors.append(record)
            return None

    def failure_label(self, record: Record) -> str:
        return f"FAILED {record}"


def describe(record: Record) -> str:
    """A measurement in a line: its kind, variant and message size."""
    return f"{record['kind']} {record['variant']} {fmt_size(record['size'])}"


def select(results: Sequence[Record], kind: str, variant: str, size: int, mode: Optional[str] = None) -> List[Record]:
    """The records of one measurement (``mode``: also that mode), from every round."""
    return [
        r
        for r in results
        if r["kind"] == kind
        and r["variant"] == variant
        and r["size"] == size
        and (mode is None or r.get("mode") == mode)
    ]


class Suite:
    """A benchmark command. Subclasses set ``description``, ``parts`` (what ``--only``
    takes), ``sizes`` (the ``--sizes`` default), ``quick_help``, ``rounds_help``,
    ``json_help``, ``no_pin_help``, ``title``, ``plan`` and ``runner`` (classes), and define
    ``headline``, ``notes``, ``summarize``, ``render`` and ``json_report``."""

    check: Optional[str] = None  # the --check help, if the suite has it: exit 1 when a target is not met
    failed_status = 1  # the exit status when a measurement failed
    setup: Optional[Callable[[dict], None]] = None  # run in each worker as it starts
    teardown: Optional[Callable[[dict], None]] = None  # and as it ends
    # set by every suite:
    description: str
    parts: Sequence[str]
    sizes: str
    quick_help: str
    rounds_help: str
    json_help: str
    no_pin_help: str
    title: str
    plan: Type[Plan]
    runner: Type[Runner]
    headline: Callable[..., str]
    notes: Callable[[Plan], Sequence[str]]
    summarize: Callable[[List[Record], List[int]], List[Record]]
    render: Callable[[List[Record]], str]
    json_report: Callable[..., Dict[str, Any]]

    def main(self, argv: Optional[Sequence[str]] = None) -> int:
        ap = argparse.ArgumentParser(description=self.description)
        harness.add_common_flags(ap, quick=self.quick_help, rounds=(0, self.rounds_help))
        ap.add_argument("--sizes", default=self.sizes, help=f"message sizes, comma separated (default {self.sizes})")
        ap.add_argument("--only", default="", help=f"comma list of: {','.join(self.parts)} (default all)")
        self.flags(ap)
        harness.add_common_flags(ap, json=self.json_help)
        self.output_flags(ap)
        harness.add_common_flags(ap, no_pin=self.no_pin_help, **({"check": self.check} if self.check else {}))
        harness.add_common_flags(ap, quiet=True)
        args = ap.parse_args(argv)
        plan = self.make_plan(ap, args, harness.parse_sizes(args.sizes), harness.parse_only(ap, args.only, self.parts))
        log = harness.logger(args.quiet)
        cpus, pinned = harness.placement(2, args.no_pin)
        started = time.monotonic()
        with self.environment(plan):
            info = {**harness.run_meta(cpus, pinned), "quick": plan.quick, "rounds": plan.rounds, "sizes": plan.sizes}
            info.update(self.meta(plan))
            log(self.headline(info, cpus, pinned))
            make_runner = lambda pool: self.runner(pool, plan, log)  # noqa: E731
            runner = harness.run_in_pool(pinned, make_runner, log, self.setup, self.teardown)
        if runner is None:
            return 130
        elapsed = time.monotonic() - started
        rows = self.summarize(runner.results, plan.sizes)
        harness.print_report_head(self.title, plan.rounds, elapsed, info["loadavg_start"], *self.notes(plan))
        self.print_tables(info, rows, runner)
        harness.print_failures(runner.errors, describe)
        if args.json:
            harness.write_json(args.json, self.json_report(info, rows, runner, elapsed))
        self.outputs(args, runner, log)
        if runner.errors:
            return self.failed_status
        return 1 if self.check and args.check and any(r.get("met") is False for r in rows) else 0

    def flags(self, ap: argparse.ArgumentParser) -> None:
        """The suite's own flags, after --only."""

    def output_flags(self, ap: argparse.ArgumentParser) -> None:
        """The suite's own output flags, after --json."""

    def make_plan(
        self, ap: argparse.ArgumentParser, args: argparse.Namespace, sizes: List[int], only: Set[str]
    ) -> Plan:
        return self.plan(args.quick, args.rounds, sizes, only)

    @contextlib.contextmanager
    def environment(self, plan: Plan) -> Iterator[None]:
        """Around the run: the environment its workers inherit."""
        yield

    def meta(self, plan: Plan) -> Dict[str, Any]:
        """What the report's meta says beside the machine, ``quick``, ``rounds`` and ``sizes``."""
        return {}

    def print_tables(self, info: Dict[str, Any], rows: List[Record], runner: Runner) -> None:
        print(self.render(rows))

    def outputs(self, args: argparse.Namespace, runner: Runner, log: harness.Log) -> None:
        """Files written after the report (beside --json)."""
