"""A worker: `python -m search worker --storage URL [--study NAME ...] [--gpu N]` joins studies and works on them
next to any number of other workers, on this machine or others, through the storage alone.

The search settings (trials, sampler, proposer, turns, confirmations) come from the study, where
`python -m search run --workers N` recorded them, so every worker searches the same way; the worker's own
options say only where it runs: storage, GPU, evaluator, results file. Each worker runs search.running.loop's
StudyLoop with the rules of search.storing.claims (study lock, claims, shares that count other workers'
trials) and search.storing.heartbeat (a dead worker's trial is failed and queued again by the others).

Bad input (unknown storage scheme, unreachable database, wrong credentials, a study that does not exist,
was made with another search space, or has no recorded settings) is one line on stderr and exit code 2,
before anything is written.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from typing import Callable

import optuna

from fa4tune.config import ConfigError, Problem, ProblemClass
from fa4tune.suites import load_suite
from fa4tune.targets import get_target
from search.evaluating.protocol import AUTO, make_evaluator
from search.evaluating.pruning import make_pruner
from search.proposing.samplers import make_sampler
from search.proposing.turns import make_policy, parse_ratio
from search.running.loop import Outcome, StopFlag, StudyLoop, loop_settings_of, run_study
from search.running.run_config import RunConfig, check_values
from search.running.view import PlainView, trial_line
from search.space import Space, get_space
from search.storing import schema
from search.storing.claims import StudyLock, default_worker_id
from search.storing.heartbeat import Heartbeat, enable, fail_stale
from search.storing.history import TrialRecord
from search.storing.storage import check_url, describe, open_existing_storage
from search.storing.study import StudySpec

INTERRUPTED = 130
# The RunConfig fields that belong to the study (recorded by `run --workers`), not to the machine.
SEARCH_FIELDS = ("n_trials", "sampler", "seed", "proposer", "model", "k", "ratio", "policy", "window", "api_timeout",
                 "api_retries", "api_backoff", "confirmations", "tolerance", "baseline", "prune_factor")


def add_parser(sub) -> None:
    """The `worker` subcommand's options."""
    p = sub.add_parser("worker", help="join studies in a shared storage and work on them next to other workers")
    p.add_argument("--storage", default="sqlite:///search.db", help="Optuna storage URL (default sqlite:///search.db)")
    p.add_argument("--study", action="append", dest="studies", help="study name (repeatable; default every study with recorded settings)")
    p.add_argument("--gpu", help="the GPU to use, as CUDA_VISIBLE_DEVICES names it (an index or a UUID)")
    p.add_argument("--evaluator", default="gpu", help="gpu or replay (default gpu)")
    p.add_argument("--table", default="", help="recorded table for the replay evaluator")
    p.add_argument("--replay-delay", type=float, default=0.0, help="seconds the replay evaluator waits per config")
    p.add_argument("--compile-jobs", type=int, default=None, help="CPU compile processes ahead of the GPU (default: cores - 1; 0: compile on the GPU's turn)")
    p.add_argument("--slots", type=int, default=0, help="trials in flight in this worker (default: what the evaluator can use)")
    p.add_argument("--results", default="results.tsv", help="results.tsv path ('' for none)")
    p.add_argument("--description", default="", help="text for the results.tsv rows")
    p.add_argument("--heartbeat", type=int, default=10, help="seconds between heartbeats of a running trial (default 10)")
    p.add_argument("--grace", type=int, default=60, help="a trial whose heartbeat is older is failed and requeued (default 60)")
    p.add_argument("--worker-id", default="", help="name in the trials' `worker` attribute (default host:pid)")


# ------------------------------------------------------------------------------------------------
# The loop of one worker on one study.
# ------------------------------------------------------------------------------------------------


class WorkerLoop(StudyLoop):
    """The study loop as one of several workers: the storage-wide study lock (given as `lock`), heartbeats on the
    trial in flight, and, on resume, only the trials of dead workers are failed and queued again (the others'
    running trials are theirs)."""

    def __init__(self, *args, requeue=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.requeue = requeue  # heartbeat.RequeueStale of the storage (what this process requeued)

    def _resume(self) -> list[int]:
        """Fails the trials of dead workers (they are queued again); enqueues upstream's default into a new study."""
        with self.lock.held():
            requeued = self._fail_stale()
            self._enqueue_baseline()
        return requeued

    def _fail_stale(self) -> list[int]:
        """fail_stale, saying which trials it closed and queued again; lock held."""
        seen = len(self.requeue.requeued) if self.requeue else 0
        fail_stale(self.study)
        requeued = self.requeue.requeued[seen:] if self.requeue else []
        if requeued:
            self.view.message(f"[{self.spec.name}] trials {', '.join(map(str, requeued))} lost their worker: closed as failed and requeued")
        return requeued

    def _heartbeat(self, trial: optuna.Trial):
        return Heartbeat(self.storage, trial)


# ------------------------------------------------------------------------------------------------
# Studies as the storage holds them.
# ------------------------------------------------------------------------------------------------


def spec_of(study: optuna.Study, suite: str, space_of: Callable[[str], Space] = get_space) -> StudySpec:
    """The StudySpec a study was made for; ConfigError when this version's space differs from the study's.
    `space_of(direction)`: the space this worker searches (a replay table's narrows the knob values)."""
    a = study.user_attrs
    missing = [k for k in (schema.DIRECTION, schema.PROBLEM_CLASS, schema.TARGET, schema.SPACE_SIGNATURE) if k not in a]
    if missing:
        raise ConfigError("study_attrs", f"study {study.study_name!r} was not made by fa4-tune (no {', '.join(missing)})")
    target = get_target(a[schema.TARGET])
    problem_class = ProblemClass.parse(a[schema.PROBLEM_CLASS])
    whole = space_of(a[schema.DIRECTION])
    space = whole.stored(a[schema.SPACE_SIGNATURE], problem_class, target)  # a study stored before a regime's cut keeps its space
    if space is None:
        raise ConfigError(
            "study_space",
            f"study {study.study_name!r} was made with another search space (signature {a[schema.SPACE_SIGNATURE]}, "
            f"this version's is {whole.for_class(problem_class, target).signature(target)}); use this version's space in another study or storage",
        )
    if a.get(schema.PROBLEM_SPECS):
        problems = tuple(Problem.from_dict(p) for p in a[schema.PROBLEM_SPECS])
    else:
        by_label = {p.label: p for p in load_suite(suite)}
        unknown = [label for label in a.get(schema.PROBLEMS, []) if label not in by_label]
        if unknown:
            raise ConfigError("study_problems", f"study {study.study_name!r} has problems the suite {suite!r} lacks: {', '.join(unknown)}")
        problems = tuple(by_label[label] for label in a.get(schema.PROBLEMS, []))
    return StudySpec(a[schema.DIRECTION], problem_class, problems, target, space)


def settings_of(study: optuna.Study) -> RunConfig:
    """The search settings `run --workers` recorded on the study."""
    recorded = study.user_attrs.get(schema.SEARCH_SETTINGS)
    if not recorded:
        raise ConfigError(
            "study_settings",
            f"study {study.study_name!r} has no recorded search settings; start it with "
            "`python -m search run --workers N` (N=0 only records them)",
        )
    return RunConfig(**check_values({k: v for k, v in recorded.items() if k in SEARCH_FIELDS}, f"study {study.study_name}"))


def _select(storage, names: list[str] | None) -> list[optuna.Study]:
    existing = optuna.study.get_all_study_names(storage)
    if names:
        unknown = [n for n in names if n not in existing]
        if unknown:
            listed = ", ".join(existing) or "none"
            raise ConfigError("study_name", f"no study named {unknown[0]!r} in the storage (studies there: {listed})")
        chosen = names
    else:
        chosen = [n for n in existing if schema.SEARCH_SETTINGS in optuna.load_study(study_name=n, storage=storage).user_attrs]
        if not chosen:
            raise ConfigError("study_name", "no study in the storage has recorded search settings; start one with `python -m search run --workers N`")
    return [optuna.load_study(study_name=n, storage=storage) for n in chosen]


class WorkerView(PlainView):
    """Plain lines tagged with the worker (several workers share a terminal)."""

    def __init__(self, tag: str, out=None):
        super().__init__(out)
        self.tag = tag

    def trial(self, study: str, r: TrialRecord, best, done: int, n_trials: int) -> None:
        print(f"{self.tag} {trial_line(study, r, best, done, n_trials)}", file=self.out, flush=True)

    def message(self, text: str) -> None:
        print(f"{self.tag} {text}", file=self.out, flush=True)


def _seed(base: int, worker_id: str) -> int:
    """Each worker its own sampler seed (equal seeds and histories would propose equal configs)."""
    return (base + int.from_bytes(hashlib.sha256(worker_id.encode()).digest()[:4], "big")) % 2**31


# ------------------------------------------------------------------------------------------------
# The command.
# ------------------------------------------------------------------------------------------------


def _make_evaluator(args, target):
    if args.slots < 0:
        raise ConfigError("slots", f"--slots must be >= 0, got {args.slots}")
    if args.compile_jobs is not None and args.compile_jobs < 0:
        raise ConfigError("compile_jobs", f"--compile-jobs must be >= 0 (leave it out for every core but one), got {args.compile_jobs}")
    jobs = AUTO if args.compile_jobs is None else args.compile_jobs
    return make_evaluator(args.evaluator, target, table=args.table, replay_delay=args.replay_delay, compile_jobs=jobs)


def main(args, out=None) -> int:
    """Runs the worker; 0 when every study is done, 130 after Ctrl-C; ConfigError for bad input."""
    out = out or sys.stdout
    if args.gpu is not None:
        if not args.gpu.strip() or "," in args.gpu:
            raise ConfigError("gpu", f"--gpu takes one GPU (an index or a UUID), got {args.gpu!r}")
        os.environ["CUDA_VISIBLE_DEVICES"] = args.gpu  # before torch is imported (the evaluator imports it)
    check_url(args.storage)
    worker_id = args.worker_id or default_worker_id()
    storage = open_existing_storage(args.storage)
    studies = _select(storage, args.studies)
    replay = _make_evaluator(args, None) if args.evaluator == "replay" else None  # a replay needs no target
    plans = [(study, spec_of(study, "standard", replay.table.space if replay else get_space), settings_of(study)) for study in studies]
    for _, spec, settings in plans:
        make_sampler(settings.sampler, settings.seed, spec)  # an unknown sampler, or a sweep with nothing feasible, fails here
        make_policy(settings.policy, parse_ratio(settings.ratio, settings.sampler, "claude"), settings.window)
    evaluator = replay or _make_evaluator(args, plans[0][1].target)
    requeue = enable(storage, args.heartbeat, args.grace)  # nothing above wrote to the storage
    print(f"worker {worker_id}: storage {describe(args.storage)}, {len(plans)} stud{'y' if len(plans) == 1 else 'ies'}, evaluator {args.evaluator}"
          + (f" on GPU {args.gpu}" if args.gpu is not None else ""), file=out, flush=True)
    if any(settings.proposer == "claude" for _, _, settings in plans):
        from search.proposing import claude

        if claude.SDK_MISSING:
            print(f"worker {worker_id}: {claude.sdk_missing_line()}", file=out, flush=True)

    stop = StopFlag()
    previous = signal.signal(signal.SIGINT, _stop_handler(stop, out, worker_id))
    slots = args.slots or getattr(evaluator, "slots", 1)  # in flight: compiling, ready, on the GPU
    outcomes: list[Outcome] = []
    try:
        for study, spec, settings in plans:
            outcomes.append(_run_study(storage, study.study_name, spec, settings, evaluator, worker_id, slots, args, stop, requeue, out))
            if stop.requested:
                break
    finally:
        signal.signal(signal.SIGINT, previous)
        if hasattr(evaluator, "close"):
            evaluator.close()
    for o in outcomes:
        best = f"best {o.winner.value:.1f} TFLOPS (#{o.winner.number}, {'confirmed' if o.confirmed else 'not confirmed'})" if o.winner else "no config passed"
        print(f"worker {worker_id}: {o.study}: {o.evaluated} evaluated, {best}", file=out, flush=True)
    return INTERRUPTED if stop.requested else 0


def _run_study(storage, name: str, spec: StudySpec, settings: RunConfig, evaluator, worker_id: str, slots: int, args, stop, requeue, out) -> Outcome:
    """The study's loops, one per slot (each with its own sampler seed), under one study lock."""
    from search.running.runner import git_commit, make_proposers
    from search.storing.study import name_metric

    proposers = make_proposers(settings)  # main() said once when the SDK is missing
    policy = make_policy(settings.policy, parse_ratio(settings.ratio, settings.sampler, "claude"), settings.window)
    loop_settings = loop_settings_of(settings, args.results or None, git_commit(), args.description)
    lock, disabled = StudyLock(storage, name), {}
    loops = []
    for i in range(slots):
        slot_id = worker_id if slots == 1 else f"{worker_id}/{i}"
        study = optuna.load_study(study_name=name, storage=storage, sampler=make_sampler(settings.sampler, _seed(settings.seed, slot_id), spec),
                                  pruner=make_pruner(settings.prune_factor))
        if i == 0:
            name_metric(study, spec.direction)  # a study made before its objective had a name gets one
        loops.append(WorkerLoop(study, spec, evaluator, settings.sampler, proposers, policy, loop_settings, WorkerView(f"[{slot_id}]", out),
                                stop, disabled, worker_id=slot_id, lock=lock, requeue=requeue))
    try:
        return run_study(loops)
    finally:
        for p in proposers:
            p.close()


def _stop_handler(stop: StopFlag, out, worker_id: str):
    def handler(signum, frame):
        stop.requested = True
        print(f"[{worker_id}] Ctrl-C: stopping after the current trial", file=out, flush=True)

    return handler
