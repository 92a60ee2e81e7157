"""`python -m search run --workers N`: create the studies, record their search settings, start N workers here.

With the GPU evaluator, one worker per local GPU (CUDA_VISIBLE_DEVICES=i each, so N is at most the number
of GPUs); with the replay evaluator (CPU), N processes. `--workers 0` only creates the studies and records
the settings, for workers started elsewhere (`python -m search worker --storage URL`). Everything is checked
before the storage is written, as `run` does.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from dataclasses import replace

import optuna

from fa4tune.config import ConfigError
from search.evaluating.protocol import AUTO, default_compile_jobs, occupancy_of
from search.proposing.samplers import make_sampler
from search.running.run_config import RunConfig
from search.running.runner import plan
from search.running.worker import INTERRUPTED, SEARCH_FIELDS
from search.storing import schema
from search.storing.claims import StudyLock
from search.storing.history import evaluated_count, records, winner
from search.storing.storage import describe, open_storage
from search.storing.study import check_existing, enqueue_baseline, open_study


def local_gpus() -> int:
    """CUDA GPUs this process sees."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_ids(count: int) -> list[str]:
    """The first `count` GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (its own list when set)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [str(i) for i in range(count)]
    return ids[:count]


def worker_command(config: RunConfig, studies: list[str], compile_jobs: int = AUTO, gpu: str | None = None) -> list[str]:
    """The `python -m search worker` arguments of one worker of this run."""
    command = [sys.executable, "-m", "search", "worker", "--storage", config.storage, "--evaluator", config.evaluator, "--results", config.results]
    if config.description:
        command += ["--description", config.description]
    for name in studies:
        command += ["--study", name]
    if config.evaluator == "replay":
        command += ["--table", config.table] + (["--replay-delay", str(config.replay_delay)] if config.replay_delay else [])
    if config.evaluator == "gpu" and compile_jobs != AUTO:
        command += ["--compile-jobs", str(compile_jobs)]
    if config.slots:
        command += ["--slots", str(config.slots)]
    if gpu is not None:
        command += ["--gpu", str(gpu)]
    return command


def prepare_studies(config: RunConfig, out) -> list[str]:
    """Checks everything, then creates or loads the studies and records settings and problems; their names."""
    run_plan = plan(config, out)
    specs = run_plan.specs
    storage = open_storage(config.storage)
    specs = check_existing(storage, specs, occupancy_of(run_plan.evaluator))
    settings = {name: getattr(config, name) for name in SEARCH_FIELDS}
    for spec in specs:
        study = open_study(storage, spec, make_sampler(config.sampler, config.seed, spec))
        with StudyLock(storage, spec.name).held():
            if study.user_attrs.get(schema.SEARCH_SETTINGS) not in (None, settings):
                print(f"{spec.name}: search settings replaced by this run's", file=out)
            study.set_user_attr(schema.SEARCH_SETTINGS, settings)
            study.set_user_attr(schema.PROBLEM_SPECS, [p.to_dict() for p in spec.problems])
            if config.baseline:  # before any worker, so only once
                enqueue_baseline(study, spec)
    return [spec.name for spec in specs]


def run_workers(config: RunConfig, workers: int, out=None) -> int:
    """Creates the studies and runs `workers` worker processes on them; the worst exit code of the workers."""
    out = out or sys.stdout
    if workers < 0:
        raise ConfigError("workers", f"--workers must be >= 0, got {workers}")
    if config.evaluator == "gpu" and workers > (found := local_gpus()):
        raise ConfigError("workers", f"--workers {workers} with the gpu evaluator needs {workers} GPUs, this machine has {found}")
    print(f"storage: {describe(config.storage)}", file=out, flush=True)
    names = prepare_studies(config, out)
    if workers == 0:
        storage = config.storage if config.storage.startswith("sqlite") else describe(config.storage)  # no password on screen
        command = worker_command(replace(config, storage=storage), [])[3:]
        print(f"{len(names)} stud{'y' if len(names) == 1 else 'ies'} ready; start workers (one per GPU) with: python -m search {shlex.join(command)} --gpu N", file=out, flush=True)
        return 0
    print(f"{len(names)} stud{'y' if len(names) == 1 else 'ies'}, {workers} worker{'' if workers == 1 else 's'}", file=out, flush=True)
    gpus = gpu_ids(workers) if config.evaluator == "gpu" else [None] * workers
    # the machine's compile processes are shared: each worker takes its part of them
    compile_jobs = default_compile_jobs(workers) if config.compile_jobs == AUTO else config.compile_jobs
    procs = [subprocess.Popen(worker_command(config, names, compile_jobs, gpu)) for gpu in gpus]

    def forward(signum, frame):  # a Ctrl-C on the terminal reaches the workers itself; a kill of this process does not
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGINT, forward)
    try:
        codes = [p.wait() for p in procs]
    finally:
        signal.signal(signal.SIGINT, previous)
    storage = open_storage(config.storage)
    for name in names:
        history = records(optuna.load_study(study_name=name, storage=storage))
        w = winner(history)
        best = f"best {w.value:.1f} TFLOPS (#{w.number}, {w.proposer})" if w else "no config passed"
        print(f"{name}: {evaluated_count(history)} evaluated by {workers} workers, {best}", file=out)
    if INTERRUPTED in codes:
        return INTERRUPTED
    return max(codes)
