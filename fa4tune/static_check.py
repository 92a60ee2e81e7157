"""The static check: compile configs for sm_120a with fake tensors (no GPU) and read the cubins.

Each (config, problem class) compiles in a worker process (`python -m fa4tune.static_worker`: a fresh
interpreter whose environment targets sm_120a before the DSL is imported, with its own dump folder) through
fa4tune.fake_compile, the compile the search's compile pipeline uses too; a compile that runs past the time
limit kills its worker, is recorded as `compile_timeout`, and the others go on. Results are cached on disk
under a key made of every knob, the problem class, the target, the kernel classes' sources (experiment.py,
kernels/) and the flash-attn-4 / CUTLASS DSL versions. A kernel (forward or backward) whose compiled shared storage
is larger than its class declares (`smem_bytes`) is rejected: `smem_understated`, with both numbers.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Iterable

from fa4tune.config import BackwardConfig, ForwardConfig, ProblemClass
from fa4tune.feasibility import check_backward, check_forward
from fa4tune.kernel_class import source_files as kernel_sources
from fa4tune.line_process import LineProcess
from fa4tune.occupancy import occupancy
from fa4tune.targets import Target

DEFAULT_CACHE = Path(os.environ.get("FA4TUNE_CACHE_DIR", Path.cwd() / ".cache")) / "static-facts.jsonl"


@dataclass(frozen=True)
class StaticJob:
    """One compile: direction, config, problem class."""

    kind: str  # "fwd" | "bwd"
    config: ForwardConfig | BackwardConfig
    problem_class: ProblemClass

    def label(self) -> str:
        return f"{self.kind} {self.problem_class.name} {self.config.short()}"


@dataclass(frozen=True)
class StaticFacts:
    """What the static check learned about one job."""

    kind: str
    problem_class: str
    config: dict
    status: str  # ok | infeasible | compile_error | compile_timeout | static_error (compiled, cubin unreadable)
    reason: str = ""
    registers: int = 0
    stack_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    static_smem_bytes: int = 0
    dynamic_smem_bytes: int = 0
    declared_smem_bytes: int = 0  # the kernel class's formula (fa4tune.kernel_class smem_bytes); 0: not recorded
    num_threads: int = 0
    blocks_per_sm: int = 0
    occupancy: float = 0.0
    occupancy_limiter: str = ""
    compile_seconds: float = 0.0
    cached: bool = field(default=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def smem_bytes(self) -> int:
        return self.static_smem_bytes + self.dynamic_smem_bytes

    def to_dict(self) -> dict:
        return asdict(self)


def verdict(job: StaticJob, target: Target):
    """Static rules for a job (no compile)."""
    check = check_forward if job.kind == "fwd" else check_backward
    return check(job.config, job.problem_class, target)


# ------------------------------------------------------------------------------------------------
# Parent side.
# ------------------------------------------------------------------------------------------------


RESULT_PREFIX = "FA4TUNE-STATIC "


class _Worker:
    """One compiler process (`python -m fa4tune.static_worker`) and the job it works on."""

    def __init__(self, experiment_path: str, env: dict):
        self.env, self.experiment_path = env, experiment_path
        os.makedirs(env["CUTE_DSL_DUMP_DIR"], exist_ok=True)
        python_path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")]))
        self.proc = LineProcess("fa4tune.static_worker", [], {**env, "PYTHONPATH": python_path}, RESULT_PREFIX)
        self.job = None
        self.started = 0.0

    def send(self, job, jobs) -> None:
        self.job, self.started = job, time.monotonic()
        self.proc.send(job_spec(jobs[job[0]], self.experiment_path))

    def poll(self) -> dict | None:
        """The worker's reply (fa4tune.static_worker.compile_job's) once it answered, else None."""
        return self.proc.reply()

    def alive(self) -> bool:
        return self.proc.alive()

    def stop(self, kill: bool = False) -> None:
        self.proc.stop(kill)


def compile_env(target: Target, dump_dir: str | None = None) -> dict:
    """Environment that makes the DSL compile SM120 kernels for the target without a GPU (cubins kept in dump_dir, by
    default a new temporary folder: never the working directory, which is where the DSL writes them otherwise)."""
    env = {
        "FLASH_ATTENTION_ARCH": target.arch,
        "CUTE_DSL_ARCH": target.cute_arch,
        "FLASH_ATTENTION_NUM_SMS": str(target.num_sms),
        "CUTE_DSL_KEEP": "cubin,ptx",
        "PYTHONWARNINGS": "ignore",
    }
    return {**env, "CUTE_DSL_DUMP_DIR": dump_dir or tempfile.mkdtemp(prefix="fa4tune-cubins-")}


def job_spec(job: StaticJob, experiment_path: str) -> dict:
    """The JSON request of fa4tune.static_worker.compile_job."""
    return {"kind": job.kind, "config": job.config.to_dict(), "problem_class": job.problem_class.to_dict(),
            "experiment_path": str(experiment_path)}


NOT_CACHED = ("compile_timeout", "compile_error", "static_error")


def cache_key(job: StaticJob, target: Target, experiment_path: str) -> str:
    """Every knob, the problem class, the target rules, the kernel classes' sources, the cubin reader and package versions."""
    source = Path(experiment_path).read_text()
    parts = [
        job.kind, repr(job.config.key()), repr(job.problem_class.key()), repr(target),
        version("flash-attn-4"), version("nvidia-cutlass-dsl"),
        hashlib.sha256(source.encode()).hexdigest(),
        hashlib.sha256(inspect.getsource(__import__("fa4tune.sm120_interface").sm120_interface).encode()).hexdigest(),
        hashlib.sha256(inspect.getsource(__import__("fa4tune.cubin").cubin).encode()).hexdigest(),  # how facts are read
        *(hashlib.sha256(path.read_bytes()).hexdigest() for path in kernel_sources()),
    ]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


class FactsCache:
    """Append-only JSON-lines file of StaticFacts by key; a torn last line is ignored. Safe to share between threads."""

    def __init__(self, path: Path | None):
        self.path = path
        self.entries: dict[str, dict] = {}
        self._lock = threading.Lock()
        if path and path.exists():
            for line in path.read_text().splitlines():
                try:
                    record = json.loads(line)
                    self.entries[record["key"]] = record["facts"]
                except (json.JSONDecodeError, KeyError):
                    continue

    def get(self, key: str) -> StaticFacts | None:
        facts = self.entries.get(key)
        return StaticFacts(**{**facts, "cached": True}) if facts else None

    def put(self, key: str, facts: StaticFacts) -> None:
        if facts.status in NOT_CACHED or self.path is None:
            return  # a timeout may be load and an error may be the environment's: try again next time
        with self._lock:
            self.entries[key] = facts.to_dict()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps({"key": key, "facts": {**facts.to_dict(), "cached": False}}) + "\n")


def known_facts(job: StaticJob, target: Target, cache: FactsCache, key: str, rules: bool = True) -> StaticFacts | None:
    """The job's facts without a compile: infeasible by the static rules (unless `rules` is False), or from the
    cache; None when it must compile."""
    check = verdict(job, target) if rules else True
    if not check:
        return facts_from_compile(job, target, "infeasible", str(check))
    return cache.get(key)


def facts_from_compile(job: StaticJob, target: Target, status: str, reason: str = "", kernel: dict | None = None) -> StaticFacts:
    """StaticFacts of a job from its compile's outcome; `kernel` (fa4tune.fake_compile.KernelFacts.resources()) when
    it compiled: the compiled shared storage against the kernel class's declared formula and against the
    target's capacity, and the occupancy."""
    base = dict(kind=job.kind, problem_class=job.problem_class.name, config=job.config.to_dict(), num_threads=job.config.num_threads)
    if status != "ok":
        return StaticFacts(status=status, reason=reason, **base)
    smem = kernel["static_smem_bytes"] + kernel["dynamic_smem_bytes"]
    # 0 declared: facts stored before backward classes declared theirs (only the forward's were compared then)
    if kernel["declared_smem_bytes"] and kernel["dynamic_smem_bytes"] > kernel["declared_smem_bytes"]:
        # feasibility and the search trust the class's formula: one that under-states lets configs through
        # that the launch cannot fit
        reason = (
            f"smem_understated: kernel {job.config.kernel!r} declares {kernel['declared_smem_bytes']} B of shared memory "
            f"(its smem_bytes), the compiled kernel's shared storage is {kernel['dynamic_smem_bytes']} B"
        )
        return StaticFacts(status="infeasible", reason=reason, **base, **kernel)
    if kernel["dynamic_smem_bytes"] > target.smem_per_block:
        # upstream's formula counts only the Q/K/V(/dO) tiles; the compiled kernel's shared storage is the truth
        reason = (
            f"smem_capacity_compiled: the compiled kernel asks for {kernel['dynamic_smem_bytes']} B of dynamic shared "
            f"memory, {target.name} has {target.smem_per_block} B per block"
        )
        return StaticFacts(status="infeasible", reason=reason, **base, **kernel)
    occ = occupancy(target, job.config.num_threads, kernel["registers"], smem)
    return StaticFacts(
        status="ok", blocks_per_sm=occ.blocks_per_sm, occupancy=round(occ.occupancy, 4), occupancy_limiter=occ.limiter,
        **base, **kernel,
    )


def facts_from_reply(job: StaticJob, target: Target, reply: dict) -> StaticFacts:
    """StaticFacts of a job from fa4tune.static_worker.compile_job's reply."""
    return facts_from_compile(job, target, reply["status"], reply.get("reason", ""), reply.get("kernel"))


class StaticChecker:
    """The static check with its compile workers kept between calls: a caller that asks one job at a time (the
    search's GPU evaluator, once per trial) pays a worker's start (seconds of imports) once, not per job.

    Workers start at the first job that needs a compile, at most `workers` of them. A changed experiment.py
    restarts them (a worker loads it once). `close()` ends them; `run_static` is the one-call form.
    """

    def __init__(self, target: Target, experiment_path: str | Path = "experiment.py", workers: int | None = None,
                 timeout_s: float = 300.0, cache_path: Path | None = DEFAULT_CACHE):
        self.target, self.timeout_s = target, timeout_s
        self.experiment_path = str(Path(experiment_path).resolve())
        self.max_workers = max(1, workers or os.cpu_count() or 1)
        self.cache = FactsCache(cache_path)
        self.slots: list[_Worker] = []
        self._tmp_root = tempfile.mkdtemp(prefix="fa4tune-static-")
        self._source = ""  # experiment.py as the running workers loaded it

    def __enter__(self) -> "StaticChecker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for worker in self.slots:
            worker.stop()
        self.slots = []
        shutil.rmtree(self._tmp_root, ignore_errors=True)

    def check(self, jobs: Iterable[StaticJob], on_result=None, rules: bool = True) -> list[StaticFacts]:
        """Static facts for every job, in job order: infeasible ones without compiling, the rest compiled in parallel.
        `rules=False` compiles what the static rules reject too (the backward census measures the rules)."""
        jobs, target = list(jobs), self.target
        results: dict[int, StaticFacts] = {}
        pending: list[tuple[int, str]] = []
        for i, job in enumerate(jobs):
            key = cache_key(job, target, self.experiment_path)
            known = known_facts(job, target, self.cache, key, rules)
            if known is None:
                pending.append((i, key))
                continue
            results[i] = known
            if on_result:
                on_result(jobs[i], results[i])
        if pending:
            self._start_workers(len(pending))
        queue, slots = list(pending), self.slots
        while queue or any(w.job for w in slots):
            for worker in slots:
                if worker.job is None and queue:
                    worker.send(queue.pop(0), jobs)
            for n, worker in enumerate(slots):
                if worker.job is None:
                    continue
                i, key = worker.job
                outcome = None
                reply = worker.poll()
                if reply is not None:
                    outcome = facts_from_reply(jobs[i], target, reply)
                elif not worker.alive():
                    outcome = facts_from_compile(jobs[i], target, "compile_error", f"compiler process died (exit code {worker.proc.returncode})")
                elif time.monotonic() - worker.started > self.timeout_s:
                    outcome = facts_from_compile(jobs[i], target, "compile_timeout", f"compile ran past {self.timeout_s:.0f} s and was killed")
                if outcome is None:
                    continue
                results[i] = outcome
                self.cache.put(key, outcome)
                if on_result:
                    on_result(jobs[i], outcome)
                worker.job = None
                if not worker.alive() or outcome.status == "compile_timeout":
                    worker.stop(kill=True)
                    slots[n] = _Worker(self.experiment_path, worker.env)
            time.sleep(0.02)
        return [results[i] for i in range(len(jobs))]

    def _start_workers(self, wanted: int) -> None:
        """Enough live workers for `wanted` compiles (at most max_workers), all with today's experiment.py."""
        self.slots = [w for w in self.slots if w.alive()]  # one that died while idle is replaced
        source = Path(self.experiment_path).read_text()
        if source != self._source:
            for worker in self.slots:
                worker.stop()
            self.slots, self._source = [], source
        while len(self.slots) < min(wanted, self.max_workers):
            dump = os.path.join(self._tmp_root, f"w{len(self.slots)}")
            self.slots.append(_Worker(self.experiment_path, compile_env(self.target, dump)))


def run_static(
    jobs: Iterable[StaticJob],
    target: Target,
    experiment_path: str | Path = "experiment.py",
    workers: int | None = None,
    timeout_s: float = 300.0,
    cache_path: Path | None = DEFAULT_CACHE,
    on_result=None,
) -> list[StaticFacts]:
    """Static facts for every job, in job order: infeasible ones without compiling, the rest compiled in parallel."""
    with StaticChecker(target, experiment_path, workers, timeout_s, cache_path) as checker:
        return checker.check(jobs, on_result)
