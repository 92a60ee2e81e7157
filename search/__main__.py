"""Command line: python -m search run | worker | report | apply | bench | dashboard | export. Bad input: one line on stderr, exit 2."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fa4tune.cli import CommandParser, count
from fa4tune.config import ConfigError
from fa4tune.harness.guards import Refused
from search.reviewing import cli as review_cli

BAD_INPUT = 2  # bad input and refusals alike: one `error:` line each
INTERRUPTED = 130  # exit code after Ctrl-C, as a shell reports it


def _run_parser(sub) -> None:
    p = sub.add_parser("run", help="run or resume the studies (sampler and Claude take turns)")
    p.add_argument("--config", help="settings file (.toml or .json) with the keys below, dashes or underscores")
    p.add_argument("--storage", help="Optuna storage URL (default sqlite:///search.db)")
    p.add_argument("--suite", help="suite name or path (default standard)")
    p.add_argument("--direction", choices=("fwd", "bwd", "both"), help="which kernels to tune (default both)")
    p.add_argument("--problem-class", action="append", dest="problem_classes", help="tune only this class (repeatable)")
    p.add_argument("--target", help="target rules (default sm120)")
    p.add_argument("--n-trials", type=int, help="evaluated configs per study (default 40)")
    p.add_argument("--sampler", help="tpe, gp, random or sweep (every feasible config once, in a seeded order)")
    p.add_argument("--seed", type=int, help="sampler seed (default 0)")
    p.add_argument("--proposer", help="claude or none (default claude)")
    p.add_argument("--model", help="Claude model")
    p.add_argument("--k", type=int, help="configs Claude proposes per turn (default 4)")
    p.add_argument("--ratio", help="sampler:proposer trials (default 1:1)")
    p.add_argument("--policy", help="fixed or adaptive (default fixed)")
    p.add_argument("--window", type=int, help="adaptive policy look-back in trials (default 10)")
    p.add_argument("--api-timeout", type=float, help="seconds per API request (default 60)")
    p.add_argument("--api-retries", type=int, help="retries of 429/529/timeouts/refused connections (default 3)")
    p.add_argument("--api-backoff", type=float, help="first retry delay in seconds, doubled per retry (default 2)")
    p.add_argument("--evaluator", help="gpu or replay (default gpu)")
    p.add_argument("--table", help="recorded table for the replay evaluator (.json or .csv)")
    p.add_argument("--replay-delay", type=float, help="seconds the replay evaluator waits per config")
    p.add_argument("--confirmations", type=int, help="re-measurements of the winner (default 2)")
    p.add_argument("--tolerance", type=float, help="a confirmation may be this fraction slower (default 0.05)")
    p.add_argument("--no-baseline", action="store_const", const=False, dest="baseline", help="do not measure upstream's default first")
    p.add_argument("--transfer-table", help="recorded table whose other classes' best configs a new study tries after the "
                   "baseline (GPU runs; default search/data/h200_sweep.json; '' for none)")
    p.add_argument("--results", help="results.tsv path ('' for none; default results.tsv)")
    p.add_argument("--description", help="text for the results.tsv rows")
    p.add_argument("--prune-factor", type=float, help="prune a config this much slower than the study's best (default 1.3; 0: never)")
    p.add_argument("--compile-jobs", type=int, help="CPU compile processes ahead of the GPU (default: cores - 1, split between "
                   "--workers; 0: compile each config on the GPU's turn)")
    p.add_argument("--slots", type=int, help="trials in flight (default: what the evaluator can use)")
    p.add_argument("--workers", type=int, help="run N worker processes (one per GPU; 0: only create the studies)")


def _parser() -> CommandParser:
    parser = CommandParser(prog="python -m search", description="Tune FlashAttention-4's SM120 configs per problem class.")
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    storages = ("Optuna storage URL (default sqlite:///search.db); repeatable: the studies of several storages, a later "
                "storage's study replacing an earlier's of the same name")
    p = sub.add_parser("report", help="best config per study and credit per proposer")
    p.add_argument("--storage", action="append", default=None, help=storages)
    review_cli.add_report_options(p)
    p = sub.add_parser("apply", help="write confirmed winners into experiment.py's dispatch tables")
    p.add_argument("--storage", action="append", default=None, help=storages)
    p.add_argument("--experiment", default="experiment.py", help="the file to edit (default experiment.py)")
    p.add_argument("--confirmations", type=int, default=2, help="confirmations a winner needs (default 2)")
    p.add_argument("--target", default="sm120", help="apply the studies of this target (default sm120)")
    p.add_argument("--allow-replay", action="store_true", help="also apply winners replayed from a table (--evaluator replay): no GPU measured them, and their "
                   "confirmations are the table's answer read again")
    p.add_argument("--dry-run", action="store_true", help="print the diff, do not write")
    p = sub.add_parser("bench", help="search efficiency of the strategies on a recorded table (CPU only)")
    p.add_argument("--table", default=None, help="recorded table (default search/data/h200_sweep.json)")
    p.add_argument("--direction", choices=("fwd", "bwd"), default="fwd", help="forward or backward studies (default fwd)")
    p.add_argument("--strategies", default="random,tpe,gp,turns,default")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--threshold", type=float, default=0.99)
    p.add_argument("--problem-class", action="append", dest="problem_classes")
    p.add_argument("--sampler", default=None, help="the sampler of the turns and default strategies (default: run's default)")
    p.add_argument("--jobs", type=count, default=os.cpu_count() or 1)
    review_cli.add_parsers(sub)
    from search.running import worker

    worker.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        commands = {"run": _run, "report": _report, "apply": _apply, "bench": _bench,
                    "dashboard": review_cli.dashboard, "export": review_cli.export, "worker": _worker}
        return commands[args.command](args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return BAD_INPUT
    except Refused as refused:  # experiment.py or kernels/ break a static rule, or the harness differs from its pin
        for line in refused.lines:
            print(f"error: {line}", file=sys.stderr)
        return BAD_INPUT
    except KeyboardInterrupt:  # before a run's own handler (imports, checks) or in a command without one: no traceback
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the group's SIGINT may come twice (`uv run` forwards it)
        print(f"interrupted by Ctrl-C (search {args.command}); what was finished is kept", file=sys.stderr)
        return INTERRUPTED


def _run(args) -> int:
    from search.running import run_config
    from search.running import runner

    cli = {k: v for k, v in vars(args).items() if k not in ("command", "config", "direction", "workers")}
    if args.direction:
        cli["directions"] = ["fwd", "bwd"] if args.direction == "both" else [args.direction]
    file_values = run_config.load_file(args.config) if args.config else {}
    config = run_config.build(file_values, cli)
    if args.workers is not None:
        from search.running.launch import run_workers

        return run_workers(config, args.workers)
    code = runner.run(config)
    review_cli.after_run(config)
    return code


def _worker(args) -> int:
    from search.running.worker import main as worker_main

    return worker_main(args)


def _storage_urls(args) -> list[str]:
    from search.storing.storage import DEFAULT_STORAGE

    return args.storage or [DEFAULT_STORAGE]


def _open_storages(args):
    """The storages named by --storage (each described on stdout) as one: review_cli.open_storages."""
    from search.storing.storage import describe

    urls = _storage_urls(args)
    for url in urls:
        print(f"storage: {describe(url)}")
    return review_cli.open_storages(urls), ", ".join(describe(url) for url in urls)


def _report(args) -> int:
    from search.reviewing.report import report

    review_cli.check_plots(args)  # before anything is printed: a committed figure is not replaced without --force
    storage, _ = _open_storages(args)
    report(storage, sys.stdout)
    review_cli.plots(args, storage)
    return 0


def _apply(args) -> int:
    from search.reviewing import apply

    path = Path(args.experiment)
    if not path.exists():
        raise ConfigError("experiment_file", f"{args.experiment!r} does not exist")
    storage, described = _open_storages(args)
    old = path.read_text()
    decisions = apply.decide(storage, args.confirmations, args.allow_replay, args.target, source=old)
    if not decisions:
        raise ConfigError("storage_empty", f"no search studies for target {args.target} in {described}: run `python -m search run` first")
    refused = [d for d in decisions if d.refusal]
    new = apply.apply(old, decisions) if not refused else old  # all or nothing: a refusal writes no entry
    for d in decisions:
        if d.refusal:
            print(f"error: {d.refusal}", file=sys.stderr)
        else:
            print(d.note)
    if refused:
        print(f"nothing written: {len(refused)} of {len(decisions)} studies refused (above); apply writes all "
              "the winners or none")
        return BAD_INPUT
    if new != old:
        print(apply.unified_diff(old, new, args.experiment), end="")
        if not args.dry_run:
            path.write_text(new)
            print(f"wrote {args.experiment}")
    elif any(d.config for d in decisions):
        print(f"{args.experiment} already holds the confirmed winners")
    return 0


def _bench(args) -> int:
    from search.running import bench
    from search.proposing.samplers import DEFAULT_SAMPLER, check_sampler

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in bench.STRATEGIES]
    if unknown:
        raise ConfigError("bench_strategy", f"strategy {unknown[0]!r} is not one of {', '.join(bench.STRATEGIES)}")
    if args.seeds < 1:
        raise ConfigError("bench_seeds", f"--seeds must be at least 1, got {args.seeds}")
    from search.evaluating.table import load_table

    path = args.table or bench.DEFAULT_TABLE
    table = load_table(path)
    kind, direction = args.direction, {"fwd": "forward", "bwd": "backward"}[args.direction]
    unknown = sorted(set(args.problem_classes or ()) - set(table.problem_classes(kind)))
    if unknown:
        raise ConfigError("problem_class", f"table {path!r} has no {direction} problem class {unknown[0]!r} "
                                           f"(classes: {', '.join(table.problem_classes(kind))})")
    classes = bench.classes_of(table, kind, classes=args.problem_classes)
    if not classes:
        raise ConfigError("table_file", f"table {path!r} has no problem class with a passing {direction} config")
    sampler = args.sampler or DEFAULT_SAMPLER
    check_sampler(sampler)  # a one-line error for an unknown name
    import time

    print(bench.header(table, classes, args.seeds, args.threshold, kind), flush=True)
    start = time.monotonic()
    for strategy in strategies:  # row by row: a long GP row does not hold back the others
        name = bench.label(strategy, sampler)

        def progress(done, total, run, name=name):  # on stderr: stdout stays the markdown table
            print(bench.progress_line(name, done, total, run, time.monotonic() - start), file=sys.stderr, flush=True)

        runs = bench.bench(path, strategy, classes, args.seeds, args.threshold, kind, jobs=args.jobs, sampler=sampler, progress=progress)
        print(bench.row(table, bench.label(strategy, sampler), runs, kind), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
