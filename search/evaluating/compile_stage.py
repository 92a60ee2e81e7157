"""The compile pipeline's compile stage, per candidate: the sm_120a static check, then the compile for the GPU's
arch into the kernel cache; on a GPU whose arch is sm_120a (a native RTX 5090) one compile is both.

    static stage   sm_120a, the problem class's static shape (fa4tune.static_worker.compile_job); facts cached
                   in .cache/static-facts.jsonl under every knob, the class, the target and the sources
    GPU stage      the GPU's arch, every gate shape (search.evaluating.precompile.compile_gate_shapes); kernels cached in
                   the kernel cache under every knob and every decision of the host path

Both compile through fa4tune.fake_compile. On sm_120a the GPU stage's compile is the static check's: its first
shape is the problem itself, whose kernel is the static shape's (the compile keys name no sequence length or
head count, only whether the sequence is a single tile, which neither is for problems longer than a tile), so
its facts are stored under the static check's key and no second compile runs. On any other GPU
(an H200 emulating SM120 compiles for sm_90a) the DSL fixes its arch per process at import, so the stages run
in two pools of compiler processes, and the GPU stage does not read its cubin (`read_facts`: registers and spills of
another arch than the target's would serve nothing, and reading them costs 0.7-0.9 s of cuobjdump per cubin).

A static check that ends the candidate (search.evaluating.gpu.STATIC_ENDS: its rules fail, it does not compile for
sm_120a, or its compiled shared storage exceeds the target's) skips the GPU stage; one that timed out or could
not read its cubin does not, as in search.evaluating.gpu.GpuEvaluator.

The two caches do not share keys: a facts key is known before any compile (the config, the problem class,
the target, the sources), while a kernel's compile key exists only once the host path has traced the call
(dtype, head dims, GQA packing, single-block flags of the shape, the arch); one class maps to several kernels
(the gate's shapes), and the facts depend on the target (its shared-memory capacity, occupancy) where the
kernel does not. The facts of each kernel entry are stored beside it (fa4tune.kernel_cache); a native
compile writes both.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import fields
from typing import Callable

from fa4tune.config import BackwardConfig, ForwardConfig, Problem
from fa4tune.static_check import (
    DEFAULT_CACHE, FactsCache, StaticFacts, StaticJob, cache_key, compile_env, facts_from_compile, facts_from_reply, job_spec,
    known_facts,
)
from fa4tune.targets import Target
from search.evaluating.gpu import STATIC_ENDS
from search.evaluating.pipeline import COMPILE_TIMEOUT_S, CompilePool

GPU_COMPILE_FUNCTION = "search.evaluating.precompile:compile_gate_shapes"
STATIC_COMPILE_FUNCTION = "fa4tune.static_worker:compile_job"
_FACT_FIELDS = {f.name for f in fields(StaticFacts)}


class CompileStage:
    """Both compile stages behind one call per candidate; `submit` and `close` make it search.evaluating.pipeline.Pipeline's pool.

    `gpu_pool` and `static_pool` run GPU_COMPILE_FUNCTION and STATIC_COMPILE_FUNCTION (CompilePool, or fakes in
    the tests); there is no static pool when the GPU's arch is the target's.
    """

    def __init__(self, target: Target, gpu_arch: str, gpu_pool, static_pool=None, facts_cache: FactsCache | None = None):
        self.target, self.gpu_arch = target, gpu_arch
        self.one_compile = gpu_arch == target.cute_arch
        if not self.one_compile and static_pool is None:
            raise ValueError(f"the GPU compiles for {gpu_arch}, the target for {target.cute_arch}: the static check needs its own pool")
        self.gpu_pool, self.static_pool = gpu_pool, static_pool
        self.facts = facts_cache if facts_cache is not None else FactsCache(DEFAULT_CACHE)

    @classmethod
    def open(cls, target: Target, gpu_arch: str, gpu_env: dict, jobs: int, cache_path=DEFAULT_CACHE,
             timeout_s: float = COMPILE_TIMEOUT_S) -> "CompileStage":
        """Started pools: `jobs` compiler processes for the GPU's arch (`gpu_env`), and as many for sm_120a unless
        that is the GPU's arch."""
        gpu_pool = CompilePool(GPU_COMPILE_FUNCTION, jobs, gpu_env, timeout_s)
        static_pool = None
        if gpu_arch != target.cute_arch:
            static_pool = CompilePool(STATIC_COMPILE_FUNCTION, jobs, {**compile_env(target), "CUDA_VISIBLE_DEVICES": ""}, timeout_s)
        return cls(target, gpu_arch, gpu_pool, static_pool, FactsCache(cache_path))

    def compile_candidate(self, job: dict) -> dict:
        """Both stages of one candidate (search.evaluating.gpu_pipeline.compile_job): {"status": ok | infeasible | compile_error,
        "reason", "static": its sm_120a facts with "arch", "compile": the GPU stage's result, None when it did not run}."""
        return self.submit(job).result()

    def submit(self, job: dict) -> Future:
        """A future of compile_candidate's result; any number of threads may submit."""
        out: Future = Future()
        if not self.one_compile:  # the GPU stage's facts would be another arch's: its cubin is not read
            job = {**job, "read_facts": False}
        config = (ForwardConfig if job["kind"] == "fwd" else BackwardConfig).from_dict(job["config"])
        static_job = StaticJob(job["kind"], config, Problem.from_dict(job["problems"][0]).problem_class)
        key = cache_key(static_job, self.target, job["experiment_path"])
        known = known_facts(static_job, self.target, self.facts, key)
        if known is not None and known.status in STATIC_ENDS:
            out.set_result(self._result(known, None))
        elif known is None and not self.one_compile:
            spec = job_spec(static_job, job["experiment_path"])
            _then(self.static_pool.submit(spec), out, lambda reply: self._after_static(job, static_job, key, reply, out))
        else:
            _then(self.gpu_pool.submit(job), out, lambda compiled: out.set_result(self._after_gpu(static_job, key, known, compiled)))
        return out

    def close(self) -> None:
        """Ends the compiler processes."""
        for pool in (self.gpu_pool, self.static_pool):
            if pool is not None:
                pool.close()

    def _after_static(self, job: dict, static_job: StaticJob, key: str, reply: dict, out: Future) -> None:
        if reply.get("timed_out"):
            facts = facts_from_compile(static_job, self.target, "compile_timeout", reply["reason"])
        else:
            facts = facts_from_reply(static_job, self.target, reply)
        self.facts.put(key, facts)
        if facts.status in STATIC_ENDS:
            out.set_result(self._result(facts, None))
        else:
            _then(self.gpu_pool.submit(job), out, lambda compiled: out.set_result(self._result(facts, compiled)))

    def _after_gpu(self, static_job: StaticJob, key: str, known: StaticFacts | None, compiled: dict) -> dict:
        if known is not None:
            return self._result(known, compiled)
        # the one compile on sm_120a: its facts are the static check's
        if compiled.get("static"):
            facts = StaticFacts(**{name: value for name, value in compiled["static"].items() if name in _FACT_FIELDS})
        else:
            status = "compile_timeout" if compiled.get("timed_out") else compiled["status"]
            facts = facts_from_compile(static_job, self.target, status, compiled.get("reason", ""))
        self.facts.put(key, facts)
        return self._result(facts, compiled)

    def _result(self, static: StaticFacts, compiled: dict | None) -> dict:
        facts = {**static.to_dict(), "arch": self.target.cute_arch}
        if compiled is None:
            return {"status": static.status, "reason": static.reason, "static": facts, "compile": None}
        stage = {name: value for name, value in compiled.items() if name != "static"}
        return {"status": compiled["status"], "reason": compiled.get("reason", ""), "static": facts, "compile": stage}


def _then(future: Future, out: Future, then: Callable[[dict], None]) -> None:
    """Calls `then(result)` when `future` is done; an error in it (or in the future) becomes `out`'s, never lost."""

    def done(f: Future) -> None:
        try:
            then(f.result())
        except Exception as err:
            if not out.done():
                out.set_exception(err)

    future.add_done_callback(done)
