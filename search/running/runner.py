"""A run: every study of the suite, one after another, on one storage.

Everything that can be wrong with the input is checked before the storage is opened for writing:
settings, suite, target, sampler, evaluator, table, storage URL, and existing studies' spaces.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from fa4tune.config import ConfigError
from fa4tune.suites import load_suite
from fa4tune.targets import get_target
from search.evaluating import protocol
from search.evaluating.protocol import AUTO, occupancy_of
from search.evaluating.pruning import make_pruner
from search.evaluating.replay import ReplayEvaluator
from search.proposing.samplers import check_sampler, make_sampler
from search.proposing.turns import make_policy, parse_ratio
from search.running.loop import EXHAUSTED, FINISHED, STALLED, LocalLock, Outcome, StopFlag, StudyLoop, loop_settings_of, run_study
from search.running.loop import INTERRUPTED as INTERRUPTED_STOP
from search.running.run_config import RunConfig
from search.running.view import make_view
from search.space import get_space
from search.storing.history import short_config
from search.storing.storage import check_reachable, describe, open_storage
from search.storing.study import StudySpec, check_existing, open_study, specs_for

INTERRUPTED = 130  # exit code after Ctrl-C, as a shell reports it


def git_commit() -> str:
    """The short commit of fa4-tune's checkout, '-dirty' (as prepare.py's rows) when a tracked file has changes:
    any one, since the evaluators in search/ measure too (prepare.py looks at experiment.py and fa4tune/ only);
    'unknown' outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _check_numbers(config: RunConfig) -> None:
    for name in ("n_trials", "k", "window"):
        if getattr(config, name) < 1:
            raise ConfigError("run_config_value", f"{name} must be at least 1, got {getattr(config, name)}")
    for name in ("confirmations", "api_retries", "slots", "replay_delay", "api_backoff"):
        if getattr(config, name) < 0:
            raise ConfigError("run_config_value", f"{name} must be >= 0, got {getattr(config, name)}")
    if not config.api_timeout > 0:
        raise ConfigError("run_config_value", f"api_timeout must be > 0 seconds, got {config.api_timeout}")
    if config.compile_jobs < AUTO:
        raise ConfigError("run_config_value", f"compile_jobs must be >= 0 (or {AUTO}: cores - 1), got {config.compile_jobs}")
    if not 0 <= config.tolerance < 1:
        raise ConfigError("run_config_value", f"tolerance must be in [0, 1), got {config.tolerance}")
    if config.prune_factor and config.prune_factor <= 1:
        raise ConfigError("run_config_value", f"prune_factor must be > 1 (or 0: never prune), got {config.prune_factor}")
    if config.proposer not in ("claude", "none"):
        raise ConfigError("run_config_value", f"proposer must be claude or none, got {config.proposer!r}")


def make_evaluator(config: RunConfig, target):
    """The run's evaluator (search.evaluating.protocol.make_evaluator with the run's settings)."""
    return protocol.make_evaluator(config.evaluator, target, table=config.table, replay_delay=config.replay_delay,
                                     compile_jobs=config.compile_jobs)


def make_proposers(config: RunConfig, say=None) -> list:
    """Claude when the run asks for it and its SDK is installed; without the SDK the sampler takes every turn
    (`say`, when given, is called once with the line that says so)."""
    if config.proposer != "claude":
        return []
    from search.proposing import claude  # the SDK takes seconds to import: only when used

    if claude.SDK_MISSING:
        if say is not None:
            say(claude.sdk_missing_line())
        return []
    return [claude.ClaudeProposer(config.model, timeout_s=config.api_timeout, retries=config.api_retries, backoff_s=config.api_backoff)]


def _what_to_tune(config: RunConfig, evaluator, out) -> tuple[list, list[str]]:
    """The suite's problems and the asked directions; with a recorded table, only what the table measured."""
    problems, directions = load_suite(config.suite), list(config.directions)
    if not isinstance(evaluator, ReplayEvaluator):
        return problems, directions
    table = evaluator.table
    if table.recorded_problems:
        problems = table.recorded_problems
        print(f"problems: the {len(problems)} recorded in {table.name} (the suite is not used)", file=out)
    directions = [d for d in directions if table.problem_classes(d)]
    if not directions:
        raise ConfigError("table_file", f"table {table.name} has no {' or '.join(config.directions)} measurements")
    if directions != list(config.directions):
        print(f"directions: {', '.join(directions)} (the table has nothing for the others)", file=out)
    return problems, directions


def _answerable(specs: list[StudySpec], evaluator, out) -> list[StudySpec]:
    """A replayed run skips, one line each, the classes its table cannot answer: no measurement of the class in that
    direction (e.g. a recorded problem whose class the sweep never measured), or a space with a knob that no measured
    value of the class fills; no study is created for them. Every class skipped is a one-line error."""
    if not isinstance(evaluator, ReplayEvaluator):
        return specs
    table, kept = evaluator.table, []
    for spec in specs:
        why = ""
        if spec.problem_class.name not in table.problem_classes(spec.direction):
            why = f"{table.name} has no {spec.direction} measurement of this class"
        else:
            empty = [name for name, values in spec.space.domain.items() if not values]
            if empty:
                why = f"no value {table.name} measured fits this class's {', '.join(empty)}"
        if why:
            print(f"skipped {spec.name}: {why}", file=out)
        else:
            kept.append(spec)
    if not kept:
        raise ConfigError("table_file", f"table {table.name} can answer none of the run's problem classes "
                                        f"({', '.join(s.name for s in specs)})")
    return kept


def _table_spaces(specs: list[StudySpec], evaluator, out) -> list[StudySpec]:
    """A replayed study searches the knob values its table measured: any other value could only answer 'missing'."""
    if not isinstance(evaluator, ReplayEvaluator):
        return specs
    table = evaluator.table
    for direction in dict.fromkeys(spec.direction for spec in specs):
        full, space = get_space(direction), table.space(direction)
        cut = [f"{name} {'/'.join(map(str, space.domain[name]))} (of {'/'.join(map(str, values))})"
               for name, values in full.domain.items() if space.domain[name] != values]
        if cut:
            print(f"space ({direction}): only the knob values {table.name} measured: {'; '.join(cut)}", file=out)
    return _answerable([replace(spec, space_override=table.space(spec.direction)) for spec in specs], evaluator, out)


def _incumbents(specs: list[StudySpec], evaluator, out) -> list[StudySpec]:
    """Each measured study knows experiment.py's dispatch entry for its class (enqueued after the baseline); a
    replayed one does not (its table need not hold it, and the bench compares strategies from upstream's default).
    An entry outside the search's domain (a kernel class that sets `searched = False`) is said and not enqueued."""
    if isinstance(evaluator, ReplayEvaluator):
        return specs
    from fa4tune.harness.settings import EXPERIMENT_PATH
    from search.storing.dispatch_table import effective_entry_config

    source = Path(getattr(evaluator, "experiment_path", None) or EXPERIMENT_PATH).read_text()
    out_specs = []
    for spec in specs:
        entry = effective_entry_config(source, spec.direction, spec.problem_class)
        outside = spec.space.in_domain(spec.space.config(entry)) if entry is not None else ""
        if outside:
            print(f"{spec.direction}:{spec.problem_class.name}: the dispatch entry is not measured in this study: {outside} "
                  f"(its kernel class is not searched); `search apply` will not replace it", file=out)
        out_specs.append(replace(spec, incumbent=entry))
    return out_specs


def _transfers(specs: list[StudySpec], evaluator, path: str) -> list[StudySpec]:
    """Each measured study gets the configs that did best on the transfer table's other classes (search.proposing.
    transfer), tried after the baseline and the incumbent; a replayed one does not (its table is the evaluator)."""
    if isinstance(evaluator, ReplayEvaluator) or not path:
        return specs
    from search.evaluating.table import load_table
    from search.proposing.transfer import transfer_configs

    file = Path(path)
    table = load_table(str(file if file.is_absolute() or file.exists() else Path(__file__).resolve().parents[2] / file))
    return [replace(spec, transfer=tuple(transfer_configs(table, spec.direction, spec.problem_class, spec.space, spec.target)))
            for spec in specs]


def _twins(specs: list[StudySpec], evaluator) -> list[StudySpec]:
    """A measured study of a window or soft-cap class tries, first among its transfer configs, the dispatch entry of
    its plain twin (the same class without the window and soft-cap) where that is feasible for it and is not the
    incumbent: the fallback rule never crosses those flags (each compiles another kernel), so without this a window
    decode's study started from upstream's SM80 loop and never drew the split-KV entry that runs it 1.7x faster than
    its 16 trials' best (docs/measurements/2026-12-07-h100-s15-window-decode-softcap-studies.md, section 1)."""
    if isinstance(evaluator, ReplayEvaluator):
        return specs
    from fa4tune.harness.settings import EXPERIMENT_PATH
    from search.storing.dispatch_table import effective_entry_config
    from search.storing.history import config_key

    source = Path(getattr(evaluator, "experiment_path", None) or EXPERIMENT_PATH).read_text()
    out_specs = []
    for spec in specs:
        pc = spec.problem_class
        twin = effective_entry_config(source, spec.direction, replace(pc, window=False, softcap=False)) \
            if pc.window or pc.softcap else None
        taken = {config_key(c) for c in (spec.incumbent, *spec.transfer) if c is not None}
        if twin is not None and config_key(twin) not in taken and not spec.space.in_domain(spec.space.config(twin)) \
                and spec.space.check(spec.space.config(twin), pc, spec.target):
            spec = replace(spec, transfer=(twin, *spec.transfer))
        out_specs.append(spec)
    return out_specs


class Plan(NamedTuple):
    """What a run tunes and how, every input checked before any storage is touched."""

    evaluator: object
    specs: list
    policy: object


def _check_classes(config: RunConfig, problems: list) -> None:
    """A --problem-class that no problem of the suite has, for the run's directions, is refused by name (as
    search.storing.study.specs_for does later, once the evaluator has loaded experiment.py)."""
    directions = list(config.directions)
    have = sorted({p.problem_class.name for p in problems if any(d == "fwd" or p.backward for d in directions)})
    unknown = sorted(set(config.problem_classes or ()) - set(have))
    if unknown:
        raise ConfigError("problem_class", f"problem class {unknown[0]!r} has no problems in the suite for {', '.join(directions)} "
                                           f"(classes: {', '.join(have) or 'none'})")


def plan(config: RunConfig, out) -> Plan:
    """Checks the numbers, target, evaluator, problems, sampler and turn policy of a run; ConfigError for bad input."""
    _check_numbers(config)
    check_reachable(config.storage)  # a storage that cannot open fails before experiment.py is loaded, as bad names do
    target = get_target(config.target)
    # an unknown suite or problem class fails here, before the evaluator loads experiment.py (cutlass: seconds)
    _check_classes(config, load_suite(config.suite))
    check_sampler(config.sampler)
    evaluator = make_evaluator(config, target)
    problems, directions = _what_to_tune(config, evaluator, out)
    specs = _table_spaces(specs_for(problems, directions, target, config.problem_classes or None), evaluator, out)
    specs = _twins(_transfers(_incumbents(specs, evaluator, out), evaluator, config.transfer_table), evaluator)
    check_sampler(config.sampler)  # an unknown sampler fails here
    policy = make_policy(config.policy, parse_ratio(config.ratio, config.sampler, "claude"), config.window)
    return Plan(evaluator, specs, policy)


def run(config: RunConfig, out=None) -> int:
    """Runs (or resumes) every study; 0 when done, 130 after Ctrl-C; ConfigError for bad input."""
    out = out or sys.stdout
    evaluator, specs, policy = plan(config, out)
    if config.sampler == "gp":
        import torch

        torch.set_num_threads(1)  # GP's small matrices: threads cost more than they give (2.5x slower with 2)
    print(f"storage: {describe(config.storage)}", file=out, flush=True)
    storage = open_storage(config.storage)
    specs = check_existing(storage, specs, occupancy_of(evaluator))
    slots = config.slots or evaluator.slots
    settings = loop_settings_of(config, config.results or None, git_commit(), config.description)
    stop = StopFlag()
    previous = signal.signal(signal.SIGINT, _stop_handler(stop, out))
    aborted = False
    outcomes: list[Outcome] = []
    disabled: dict[str, str] = {}
    try:
        with make_view(out) as view:
            proposers = make_proposers(config, view.message)
            print(f"{len(specs)} stud{'y' if len(specs) == 1 else 'ies'}, {config.n_trials} evaluated config{'' if config.n_trials == 1 else 's'} each; sampler {config.sampler}, "
                  f"proposers {', '.join(p.name for p in proposers) or 'none'}, turns {policy.describe() if proposers else 'the sampler only'}; "
                  f"evaluator {describe_evaluator(evaluator)}, slots {slots} (trials in flight at once)"
                  + (f"; a new study tries up to {max(len(s.transfer) for s in specs)} configs from {config.transfer_table}'s other "
                     "classes after its baseline" if any(s.transfer for s in specs) else ""), file=out, flush=True)
            try:
                for spec in specs:
                    outcomes.append(run_study(_loops(storage, spec, config, evaluator, proposers, policy, settings, view, stop, disabled, slots)))
                    if stop.requested:
                        break
            except KeyboardInterrupt:  # a second Ctrl-C on the terminal: the trial in flight stays RUNNING
                aborted = True
            finally:
                for p in proposers:
                    p.close()
    finally:
        # once stopping, a late SIGINT (one the process group got twice, e.g. through `uv run`) must not break the summary
        signal.signal(signal.SIGINT, signal.SIG_IGN if stop.requested or aborted else previous)
        if hasattr(evaluator, "close"):
            evaluator.close()
    for o in outcomes:
        print(summary(o), file=out)
    if aborted:
        print("aborted by a second Ctrl-C: the trial in flight was left running (the same command requeues it and "
              "continues)", file=out)
        return INTERRUPTED
    if stop.requested:
        print("stopped by Ctrl-C; run the same command again to continue", file=out)
        return INTERRUPTED
    return 0


def _loops(storage, spec, config: RunConfig, evaluator, proposers, policy, settings, view, stop, disabled, slots: int) -> list[StudyLoop]:
    """One loop per slot on one study object (its sampler asks for each slot in turn) and one lock of this process."""
    study = open_study(storage, spec, make_sampler(config.sampler, config.seed, spec), make_pruner(config.prune_factor))
    lock = LocalLock()
    return [StudyLoop(study, spec, evaluator, config.sampler, proposers, policy, settings, view, stop, disabled,
                      lock=lock, worker_id=f"local/{i}" if slots > 1 else "local") for i in range(slots)]


def describe_evaluator(evaluator) -> str:
    """e.g. 'gpu, compiling ahead in 15 CPU processes' or 'replay of table.json'."""
    if isinstance(evaluator, ReplayEvaluator):
        return f"replay of {evaluator.table.name}"
    jobs = getattr(evaluator, "compile_jobs", 0)
    return f"gpu, compiling ahead in {jobs} CPU processes" if jobs else "gpu, compiling on the GPU's turn"


REPEAT_S = 1.0  # a SIGINT this soon after the first is the same interrupt (`uv run` forwards the group's SIGINT ~0.2 s later)


def on_terminal() -> bool:
    """Whether this process is in the foreground of a terminal, where a second Ctrl-C is a person's (an agent's
    harness or `timeout -s INT` runs it in a group of its own, without a terminal, and may signal it more than once)."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


def _stop_handler(stop: StopFlag, out, terminal: bool | None = None):
    """The first SIGINT stops the run after the current trial; a later one aborts it only on a terminal, and only
    REPEAT_S after the first (a process group's SIGINT often arrives twice: from the sender and from `uv run`)."""
    terminal = on_terminal() if terminal is None else terminal
    first: list[float] = []

    def handler(signum, frame):
        if not first:
            first.append(time.monotonic())
            stop.requested = True
            print("Ctrl-C: stopping after the current trial" + (" (Ctrl-C again aborts)" if terminal else ""), file=out, flush=True)
        elif terminal and time.monotonic() - first[0] > REPEAT_S:
            raise KeyboardInterrupt

    return handler


def summary(o: Outcome) -> str:
    """The closing line of a study: how it ended, its best config and whether that is confirmed."""
    ended = {FINISHED: " (finished earlier, nothing to do)", EXHAUSTED: " (space exhausted)", STALLED: " (stalled)",
             INTERRUPTED_STOP: " (stopped by Ctrl-C)"}.get(o.stopped, "")
    if o.winner is None:
        return f"{o.study}: {o.evaluated} evaluated, no config passed{ended}"
    state = "confirmed" if o.confirmed else "not confirmed"
    return (f"{o.study}: {o.evaluated} evaluated, best {o.winner.value:.1f} TFLOPS (#{o.winner.number}, {o.winner.proposer}, {state})"
            f"{ended}: {short_config(o.winner.config)}")
