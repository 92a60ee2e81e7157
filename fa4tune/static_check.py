"""The static check: compile configs for sm_120a with fake tensors (no GPU) and read the cubins.

Each (config, problem class) compiles in a worker process (spawned, so each has its own DSL state
and dump folder); a compile that runs past the time limit kills its worker, is recorded as
`compile_timeout`, and the others go on. Results are cached on disk under a key made of every knob,
the problem class, the target, the kernel class's source and the flash-attn-4 / CUTLASS DSL versions.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import multiprocessing
import os
import time
import traceback
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Iterable

from fa4tune.config import BackwardConfig, ForwardConfig, ProblemClass
from fa4tune.feasibility import check_backward, check_forward
from fa4tune.occupancy import occupancy
from fa4tune.targets import Target

DEFAULT_CACHE = Path(os.environ.get("FA4TUNE_CACHE_DIR", Path.cwd() / ".cache")) / "static-facts.jsonl"
COMPILE_SEQLEN = 1024  # several tiles in both directions; kernels do not specialise on it


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
    status: str  # ok | infeasible | compile_error | compile_timeout
    reason: str = ""
    registers: int = 0
    stack_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    static_smem_bytes: int = 0
    dynamic_smem_bytes: int = 0
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
# Worker side: runs in a spawned process.
# ------------------------------------------------------------------------------------------------

_RECORDING: dict[type, type] = {}
_LAST_SMEM: list[int] = []


def _recording_class(base: type) -> type:
    """A subclass of `base` that notes the shared-storage size its launch asks for."""
    if base not in _RECORDING:

        def _get_shared_storage_cls(self):
            cls = base._get_shared_storage_cls(self)
            _LAST_SMEM.append(int(cls.size_in_bytes()))
            return cls

        _RECORDING[base] = type(base.__name__, (base,), {"_get_shared_storage_cls": _get_shared_storage_cls, "__module__": base.__module__})
    return _RECORDING[base]


def _load_experiment(path: str):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("experiment", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["experiment"] = module
    spec.loader.exec_module(module)
    return module


def _compile_in_worker(experiment_path: str, job: StaticJob) -> dict:
    """Compile one job with fake tensors; return the cubin facts (raises on compile errors)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fa4tune.cubin import read_cubin
    from fa4tune.sm120_interface import build

    experiment = _load_experiment(experiment_path)
    class_for = _worker_class_for(experiment)
    host = build(class_for)
    compiled: list = []
    cache = host.fwd_cache if job.kind == "fwd" else host.bwd_cache
    cache.listeners[:] = [lambda key, fn: compiled.append(fn)]
    _LAST_SMEM.clear()
    pc, cfg = job.problem_class, job.config
    dtype = torch.bfloat16 if pc.dtype == "bf16" else torch.float16
    heads_kv = 2
    heads = heads_kv * pc.qhead_per_kvhead
    start = time.perf_counter()
    with FakeTensorMode():
        q = torch.empty(1, COMPILE_SEQLEN, heads, pc.head_dim, dtype=dtype, device="cuda")
        k = torch.empty(1, COMPILE_SEQLEN, heads_kv, pc.head_dim, dtype=dtype, device="cuda")
        v = torch.empty(1, COMPILE_SEQLEN, heads_kv, pc.head_dim_v, dtype=dtype, device="cuda")
        if job.kind == "fwd":
            host.flash_attn_fwd(q, k, v, causal=pc.causal, tile_mn=(cfg.tile_m, cfg.tile_n), return_lse=True, sm120_config=cfg)
        else:
            out = torch.empty(1, COMPILE_SEQLEN, heads, pc.head_dim_v, dtype=dtype, device="cuda")
            lse = torch.empty(1, heads, COMPILE_SEQLEN, dtype=torch.float32, device="cuda")
            host.flash_attn_bwd(q, k, v, out, torch.empty_like(out), lse, causal=pc.causal, sm120_config=cfg)
    seconds = time.perf_counter() - start
    if not compiled:
        raise RuntimeError("nothing was compiled (a cache hit in a fresh worker should not happen)")
    facts = read_cubin(compiled[-1].__cubin__)
    return dict(
        registers=facts.registers, stack_bytes=facts.stack_bytes, spill_store_bytes=facts.spill_store_bytes,
        spill_load_bytes=facts.spill_load_bytes, static_smem_bytes=facts.static_smem_bytes,
        dynamic_smem_bytes=_LAST_SMEM[-1] if _LAST_SMEM else 0, compile_seconds=seconds,
    )


def _worker_class_for(experiment):
    def class_for(config):
        return _recording_class(experiment.kernel_class(config))

    return class_for


def _worker_main(conn, experiment_path: str, env: dict) -> None:
    os.environ.update(env)
    os.makedirs(env["CUTE_DSL_DUMP_DIR"], exist_ok=True)
    import warnings

    warnings.filterwarnings("ignore")
    while True:
        job = conn.recv()
        if job is None:
            return
        try:
            conn.send(("ok", _compile_in_worker(experiment_path, job)))
        except Exception as err:  # a compile error is a result, not a crash
            detail = traceback.format_exception_only(type(err), err)[-1].strip()
            conn.send(("error", detail[:500]))
        for f in Path(env["CUTE_DSL_DUMP_DIR"]).glob("*"):
            f.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------
# Parent side.
# ------------------------------------------------------------------------------------------------


def compile_env(target: Target, dump_dir: str) -> dict:
    """Environment that makes the DSL compile SM120 kernels for the target without a GPU."""
    return {
        "FLASH_ATTENTION_ARCH": target.arch,
        "CUTE_DSL_ARCH": target.cute_arch,
        "FLASH_ATTENTION_NUM_SMS": str(target.num_sms),
        "CUTE_DSL_KEEP": "cubin,ptx",
        "CUTE_DSL_DUMP_DIR": dump_dir,
        "PYTHONWARNINGS": "ignore",
    }


def cache_key(job: StaticJob, target: Target, experiment_path: str) -> str:
    """Every knob, the problem class, the target rules, the kernel class source and package versions."""
    source = Path(experiment_path).read_text()
    parts = [
        job.kind, repr(job.config.key()), repr(job.problem_class.key()), repr(target),
        version("flash-attn-4"), version("nvidia-cutlass-dsl"),
        hashlib.sha256(source.encode()).hexdigest(),
        hashlib.sha256(inspect.getsource(__import__("fa4tune.sm120_interface").sm120_interface).encode()).hexdigest(),
    ]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


class FactsCache:
    """Append-only JSON-lines file of StaticFacts by key; a torn last line is ignored."""

    def __init__(self, path: Path | None):
        self.path = path
        self.entries: dict[str, dict] = {}
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
        if facts.status == "compile_timeout" or self.path is None:
            return  # a timeout may be load, not the config: try again next time
        self.entries[key] = facts.to_dict()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"key": key, "facts": {**facts.to_dict(), "cached": False}}) + "\n")


def _finish(job: StaticJob, target: Target, status: str, payload) -> StaticFacts:
    base = dict(kind=job.kind, problem_class=job.problem_class.name, config=job.config.to_dict(), num_threads=job.config.num_threads)
    if status != "ok":
        return StaticFacts(status=status, reason=str(payload), **base)
    smem = payload["static_smem_bytes"] + payload["dynamic_smem_bytes"]
    if payload["dynamic_smem_bytes"] > target.smem_per_block:
        # upstream's formula counts only the Q/K/V(/dO) tiles; the compiled kernel's shared storage is the truth
        reason = (
            f"smem_capacity_compiled: the compiled kernel asks for {payload['dynamic_smem_bytes']} B of dynamic shared "
            f"memory, {target.name} has {target.smem_per_block} B per block"
        )
        return StaticFacts(status="infeasible", reason=reason, **base, **payload)
    occ = occupancy(target, job.config.num_threads, payload["registers"], smem)
    return StaticFacts(
        status="ok", blocks_per_sm=occ.blocks_per_sm, occupancy=round(occ.occupancy, 4), occupancy_limiter=occ.limiter,
        **base, **payload,
    )


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
    import tempfile

    experiment_path = str(Path(experiment_path).resolve())
    jobs = list(jobs)
    cache = FactsCache(cache_path)
    results: dict[int, StaticFacts] = {}
    pending: list[tuple[int, str]] = []
    for i, job in enumerate(jobs):
        check = verdict(job, target)
        key = cache_key(job, target, experiment_path)
        if not check:
            results[i] = _finish(job, target, "infeasible", str(check))
        elif (hit := cache.get(key)) is not None:
            results[i] = hit
        else:
            pending.append((i, key))
            continue
        if on_result:
            on_result(jobs[i], results[i])
    workers = max(1, min(workers or os.cpu_count() or 1, len(pending) or 1))
    ctx = multiprocessing.get_context("spawn")
    tmp_root = tempfile.mkdtemp(prefix="fa4tune-static-")
    slots: list[dict] = []

    def start_worker(n: int) -> dict:
        parent, child = ctx.Pipe()
        env = compile_env(target, os.path.join(tmp_root, f"w{n}-{time.monotonic_ns()}"))
        proc = ctx.Process(target=_worker_main, args=(child, experiment_path, env), daemon=True)
        proc.start()
        child.close()
        return {"proc": proc, "conn": parent, "job": None, "started": 0.0}

    queue = list(pending)
    try:
        slots = [start_worker(n) for n in range(workers)]
        while queue or any(s["job"] for s in slots):
            for n, slot in enumerate(slots):
                if slot["job"] is None and queue:
                    slot["job"] = queue.pop(0)
                    slot["started"] = time.monotonic()
                    slot["conn"].send(jobs[slot["job"][0]])
            for n, slot in enumerate(slots):
                if slot["job"] is None:
                    continue
                i, key = slot["job"]
                outcome = None
                if slot["conn"].poll(0.05):
                    try:
                        status, payload = slot["conn"].recv()
                        outcome = _finish(jobs[i], target, "ok" if status == "ok" else "compile_error", payload)
                    except (EOFError, OSError):
                        outcome = _finish(jobs[i], target, "compile_error", f"compiler process died (exit code {slot['proc'].exitcode})")
                elif not slot["proc"].is_alive():
                    outcome = _finish(jobs[i], target, "compile_error", f"compiler process died (exit code {slot['proc'].exitcode})")
                elif time.monotonic() - slot["started"] > timeout_s:
                    outcome = _finish(jobs[i], target, "compile_timeout", f"compile ran past {timeout_s:.0f} s and was killed")
                if outcome is None:
                    continue
                results[i] = outcome
                cache.put(key, outcome)
                if on_result:
                    on_result(jobs[i], outcome)
                if outcome.status == "ok" or (outcome.status == "compile_error" and slot["proc"].is_alive()):
                    slot["job"] = None
                else:
                    slot["proc"].kill()
                    slot["proc"].join()
                    slots[n] = start_worker(n)
    finally:
        for slot in slots:
            try:
                slot["conn"].send(None)
            except (BrokenPipeError, OSError):
                pass
        for slot in slots:
            slot["proc"].join(timeout=5)
            if slot["proc"].is_alive():
                slot["proc"].kill()
    return [results[i] for i in range(len(jobs))]
