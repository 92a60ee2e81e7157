"""Emulation fidelity: whether a kernel timed on a GPU that emulates SM120 is the kernel an SM120 GPU would run.

Under emulation (an H100 or H200 runs the SM120 code compiled for sm_90a) ptxas allocates registers for another arch,
and the same config can come out with other registers and spills than on SM120: upstream's d192/v128 backward
(64 x 64, 128 threads) compiles to 32 registers and 30,500 B of spill traffic for sm_90a, to 255 registers and 1,464 B
for sm_120a (2026-12-07, CPU compiles), so its emulated time (61.9 ms) says little about SM120's. For every (direction,
config, problem class) a bench times, its kernel is compiled for sm_120a (exact for SM120) and for the GPU's arch,
both for the class's first problem's own shape, in CPU processes before the timing starts (`gather`); a candidate
whose two compiles disagree beyond the margins below, or whose registers give SM120 another number of CTAs per SM,
is flagged (`disagreement`), and a flagged row is left out of the geomeans (bench/table_vs_upstream.py). On an
SM120 GPU the GPU's compile is sm_120a's: nothing is flagged.

The sm_120a facts are cached (FACTS_CACHE, keyed by fa4tune.static_check.cache_key and the shape: the sources, the
versions, the target), so they can be computed on a CPU machine ahead (`bench/table_vs_upstream.py --fidelity-only`)
and carried; the GPU arch's compile goes into the kernel cache (its facts stored beside each kernel), which the
timing process then loads, so it costs the GPU run no compile it would not make anyway.
"""

from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager
from pathlib import Path

from fa4tune.static_check import DEFAULT_CACHE

# The margins, from the standard and generalization suites' 44 kernels (the table's and upstream's, each class's first
# problem) compiled for sm_90a and sm_120a on 2026-12-07 (CPU, fake tensors): where nothing distorts the compile,
# registers differ by at most 35 (the d128 chunked TMA entry: 255 and 220, neither spilling, the same CTAs per SM) and
# spill traffic by at most 260 B (both spilling), with 8-48 B spilled on one arch only (a few spills outside the main
# loop); upstream's d192/v128 backward differs by 223 registers and 29,036 B. Beyond these margins, or where the two
# register counts give SM120 another number of CTAs per SM (the emulating GPU has the same 64K registers per SM and
# its launches are padded to SM120's CTAs by shared memory: fa4tune.emulated_occupancy), the emulated time is not
# taken for SM120's.
REGISTER_MARGIN = 48  # registers per thread
SPILL_MARGIN_BYTES = 512  # spill traffic: the bytes of local-memory stores plus loads in the SASS (fa4tune.cubin)
FACTS_CACHE = DEFAULT_CACHE.with_name("fidelity-facts.jsonl")
COMPILE_FUNCTION = "bench.fidelity:compile_facts"
NATIVE = "native: the GPU's compile is sm_120a's"


def facts_key(kind: str, config, problem_class) -> tuple:
    """The kernel a (direction, config, problem class) runs: the key its facts are found under."""
    return kind, repr(config.key()), problem_class.name


def jobs_of(pairs) -> list[tuple]:
    """(kind, config, problem) per kernel of the pairs ("fwd"|"bwd", config, problem): each (kind, config, problem
    class) once, with its first problem, whose shape both arches compile."""
    jobs: dict = {}
    for kind, config, problem in pairs:
        jobs.setdefault(facts_key(kind, config, problem.problem_class), (kind, config, problem))
    return list(jobs.values())


def compile_facts(job: dict) -> dict:
    """A compiler process's job (search.evaluating.pipeline.CompilePool): the kind's config compiled (or loaded from
    the kernel cache) for the job's problem only, as the harness calls it; the kernel's registers and spills."""
    from fa4tune.config import BackwardConfig, ForwardConfig, Problem
    from fa4tune.fake_compile import compile_shapes, error_reason
    from fa4tune.harness.candidates import load_experiment
    from fa4tune.kernel_cache import compile_arch

    config = (ForwardConfig if job["kind"] == "fwd" else BackwardConfig).from_dict(job["config"])
    experiment, shapes = load_experiment(job["experiment_path"]), [Problem.from_dict(job["problem"])]
    try:
        facts = compile_shapes(experiment, job["kind"], config, shapes)
        if facts.cubin_error.startswith(NO_STORED_FACTS):
            # stored by a compile that read no cubin (search run's GPU stage under emulation): compile it again here,
            # the entry stays, its facts are stored beside it
            with fresh_compiles(kernel_cache_of(experiment, job["kind"], config)):
                facts = compile_shapes(experiment, job["kind"], config, shapes)
    except Exception as err:  # the candidate fails its gate the same way: here it only has no facts
        return {"status": "compile_error", "reason": error_reason(err), "arch": compile_arch()}
    if facts.cubin_error:
        return {"status": "static_error", "reason": facts.cubin_error, "arch": compile_arch()}
    return {"status": "ok", "reason": "", "arch": compile_arch(), "kernel": facts.resources()}


NO_STORED_FACTS = "loaded from the kernel cache, which holds no facts"  # fa4tune.fake_compile's words


def kernel_cache_of(experiment, kind: str, config):
    """The compile cache the host path keeps the kind's kernels of `config` in (fa4tune.fake_compile's choice)."""
    from fa4tune.sm120_interface import build

    if kind == "fwd" and getattr(experiment.kernel_class(config), "quantizes", False):
        from fa4tune import fp8

        return fp8.COMPILED
    host = build(experiment.kernel_class)
    return host.fwd_cache if kind == "fwd" else host.bwd_cache


@contextmanager
def fresh_compiles(cache):
    """While open, a disk kernel cache (fa4tune.kernel_cache.DiskCompileCache) loads nothing: every kernel compiles
    (an existing entry is kept, the new facts are written beside it)."""
    if not hasattr(cache, "_load"):
        yield
        return
    cache._load = lambda key: False
    try:
        yield
    finally:
        del cache._load


def kernel_facts(reply: dict, arch: str, target, num_threads: int) -> dict:
    """{"arch", "registers", "spill_bytes", "ctas_per_sm"} of a compile_facts reply, or {"arch", "error"}; CTAs per
    SM are SM120's (the target's) for the kernel's threads, registers and shared memory."""
    from fa4tune.occupancy import occupancy

    if reply.get("status") != "ok":
        return {"arch": reply.get("arch") or arch, "error": f"{reply.get('status')}: {reply.get('reason', '')[:200]}"}
    kernel = reply["kernel"]
    smem = kernel["static_smem_bytes"] + kernel["dynamic_smem_bytes"]
    return {"arch": reply.get("arch") or arch, "registers": kernel["registers"],
            "spill_bytes": kernel["spill_store_bytes"] + kernel["spill_load_bytes"],
            "ctas_per_sm": occupancy(target, num_threads, kernel["registers"], smem).blocks_per_sm}


def cache_key(kind: str, config, problem, target, experiment_path) -> str:
    """The sm_120a facts' key: the static check's (every knob, the class, the target, the sources, the versions) and the shape."""
    from fa4tune.static_check import StaticJob, cache_key as static_key

    shape = (problem.batch, problem.seqlen_q, problem.seqlen_k, problem.num_heads, problem.num_heads_kv)
    base = static_key(StaticJob(kind, config, problem.problem_class), target, str(experiment_path))
    return hashlib.sha256(f"{base}\x1f{shape}\x1ffidelity".encode()).hexdigest()


def gather(jobs, target, experiment_path, workers: int, gpu_arch: str | None = None, gpu_env: dict | None = None,
           cache_path: Path | None = FACTS_CACHE, pool=None, log=print) -> dict:
    """{facts_key: {"sm120a": kernel_facts, "run": kernel_facts or None}} for the jobs ((kind, config, problem)):
    sm_120a's from the cache or compiled in CPU processes (an sm_120a environment), the GPU arch's (`gpu_arch`, in
    `gpu_env`: search.evaluating.gpu_pipeline.compile_env, the kernel cache's) compiled or loaded in others, the two
    pools at once, `workers` processes in all. Without `gpu_arch` only sm_120a's (the CPU machine's run ahead); where
    `gpu_arch` is the target's, one compile serves both. `pool(function, jobs, env)` makes a pool (CompilePool)."""
    from fa4tune.static_check import FactsCache, StaticFacts, compile_env

    if pool is None:
        from search.evaluating.pipeline import CompilePool as pool
    start = time.perf_counter()
    native = gpu_arch == target.cute_arch
    cache = FactsCache(cache_path)
    found: dict = {facts_key(kind, cfg, p.problem_class): {"sm120a": None, "run": None} for kind, cfg, p in jobs}
    to_compile = []  # sm_120a compiles: those the cache lacks
    for kind, cfg, p in jobs:
        cached = None if native else cache.get(cache_key(kind, cfg, p, target, experiment_path))
        if cached is not None and cached.ok:
            facts = {"status": "ok", "arch": target.cute_arch, "kernel": cached.to_dict()}
            found[facts_key(kind, cfg, p.problem_class)]["sm120a"] = kernel_facts(facts, target.cute_arch, target, cfg.num_threads)
        else:
            to_compile.append((kind, cfg, p))
    gpu_jobs = jobs if gpu_arch else []
    sm_jobs = [] if native else to_compile
    both = bool(gpu_jobs) and bool(sm_jobs)
    pools = []
    try:
        futures = []
        if gpu_jobs:
            gpu_pool = pool(COMPILE_FUNCTION, max(1, workers // 2) if both else workers, gpu_env or {})
            pools.append(gpu_pool)
            futures += [("run", job, gpu_pool.submit(_job(job, experiment_path))) for job in gpu_jobs]
        if sm_jobs:
            sm_pool = pool(COMPILE_FUNCTION, max(1, workers - workers // 2) if both else workers,
                           {**compile_env(target), "CUDA_VISIBLE_DEVICES": ""})
            pools.append(sm_pool)
            futures += [("sm120a", job, sm_pool.submit(_job(job, experiment_path))) for job in sm_jobs]
        for side, (kind, cfg, p), future in futures:
            reply = future.result()
            key = facts_key(kind, cfg, p.problem_class)
            found[key][side] = kernel_facts(reply, gpu_arch if side == "run" else target.cute_arch, target, cfg.num_threads)
            if native:
                found[key]["sm120a"] = found[key]["run"]
            elif side == "sm120a" and reply.get("status") == "ok":
                cache.put(cache_key(kind, cfg, p, target, experiment_path),
                          StaticFacts(kind, p.problem_class.name, cfg.to_dict(), "ok", **reply["kernel"]))
    finally:
        for made in pools:
            made.close()
    arches = [arch for arch, jobs_of_arch in ((gpu_arch, gpu_jobs), (target.cute_arch, sm_jobs)) if jobs_of_arch]
    log(f"fidelity facts of {len(jobs)} kernels ({len(jobs) - len(sm_jobs) - len(gpu_jobs) * native} of sm_120a's from the cache"
        f"{', one compile: the GPU is the target' if native else ''}): {' and '.join(arches) or 'nothing'} compiled or loaded "
        f"in {time.perf_counter() - start:.0f} s with {workers} processes")
    return found


def _job(job: tuple, experiment_path) -> dict:
    kind, config, problem = job
    return {"kind": kind, "config": config.to_dict(), "problem": problem.to_dict(), "experiment_path": str(experiment_path)}


def disagreement(sm120a: dict, run: dict) -> str:
    """'' where the two compiles agree (spill traffic within SPILL_MARGIN_BYTES, registers within REGISTER_MARGIN and
    giving SM120 the same CTAs per SM), else what differs, with both compiles' facts."""
    spill_a, spill_b = sm120a["spill_bytes"], run["spill_bytes"]
    both = f"{describe(sm120a)} vs {describe(run)}"
    if abs(spill_a - spill_b) > SPILL_MARGIN_BYTES:
        what = "one spills, the other not" if not (spill_a and spill_b) else f"spills differ by more than {SPILL_MARGIN_BYTES} B"
        return f"{what}: {both}"
    if abs(sm120a["registers"] - run["registers"]) > REGISTER_MARGIN:
        return f"registers differ by more than {REGISTER_MARGIN}: {both}"
    if sm120a.get("ctas_per_sm") != run.get("ctas_per_sm"):
        return f"the registers give SM120 another number of CTAs per SM: {both}"
    return ""


def describe(facts: dict | None) -> str:
    """'sm_90a 32 regs, 30500 B spilled, 1 CTAs/SM', or what kept the facts away."""
    if not facts:
        return "not compiled"
    if "error" in facts:
        return f"{facts['arch']} {facts['error']}"
    ctas = f", {facts['ctas_per_sm']} CTAs/SM" if facts.get("ctas_per_sm") is not None else ""
    return f"{facts['arch']} {facts['registers']} regs, {facts['spill_bytes']} B spilled{ctas}"


def candidate_fidelity(found: dict | None, why_none: str = "not compiled ahead (--compile-jobs 0)") -> dict:
    """The "fidelity" of one timed candidate (a JSON line's field): both arches' facts, `flag` (why it is flagged,
    '' when not) and `unchecked` (why the two could not be compared, '' when they were)."""
    if found is None:
        return {"sm120a": None, "run": None, "flag": "", "unchecked": why_none}
    sm120a, run = found.get("sm120a"), found.get("run")
    out = {"sm120a": sm120a, "run": run, "flag": "", "unchecked": ""}
    if sm120a is not None and sm120a is run:
        out["unchecked"] = NATIVE  # one compile: nothing to compare, nothing to flag
    elif not sm120a or not run or "error" in sm120a or "error" in run:
        out["unchecked"] = f"no facts: {describe(sm120a)}; {describe(run)}"
    else:
        out["flag"] = disagreement(sm120a, run)
    return out


def row_flag(fidelity: dict) -> str:
    """A row's flag from its candidates' fidelity ({candidate: candidate_fidelity or None}): each flagged
    candidate's reason, '' when none is flagged."""
    return "; ".join(f"{name}: {f['flag']}" for name, f in fidelity.items() if f and f.get("flag"))


def row_unchecked(fidelity: dict) -> str:
    """The candidates whose two compiles could not be compared (native runs excepted), with why."""
    return "; ".join(f"{name}: {f['unchecked']}" for name, f in fidelity.items()
                     if f and f.get("unchecked") and f["unchecked"] != NATIVE)
