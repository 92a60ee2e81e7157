"""The compile pipeline's compile for the GPU's arch: one candidate compiled with fake tensors (CPU only), for
every shape the GPU process will run, into the on-disk kernel cache (fa4tune.kernel_cache).

Runs in a compiler process of search.evaluating.pipeline, whose environment names the arch and the cache
(FA4TUNE_KERNEL_CACHE, CUTE_DSL_ARCH, FLASH_ATTENTION_ARCH, FLASH_ATTENTION_NUM_SMS) before the DSL is
imported. The shapes are the GPU's: each problem and its gate cases for the pipeline's gate seed
(the harness's settings), compiled by fa4tune.fake_compile as the harness calls them, so that the compile keys
are the harness's. A compile error, or a kernel whose compiled shared storage exceeds the target's, ends here:
it never reaches the GPU. search.evaluating.compile_stage puts the sm_120a static check in front of it (which has
judged the same shared storage already) and then asks for no cubin facts (job["read_facts"] False: the facts are
then "static_error", not judged).
"""

from __future__ import annotations

import time


def gate_shapes(problems, gate_seed: int, random_problems: int) -> list:
    """The problems and their gate cases' shapes, without repeats, as the harness builds them."""
    from fa4tune.harness import gate
    from fa4tune.harness.settings import GATE_RANDOM_MAX_SEQLEN, GATE_SCALE, GATE_SEQLEN_OFFSET

    shapes, seen = [], set()
    for p in problems:
        cases = gate.gate_cases(p, gate_seed, scale=GATE_SCALE, seqlen_offset=GATE_SEQLEN_OFFSET,
                                random_count=random_problems, random_max_seqlen=GATE_RANDOM_MAX_SEQLEN)
        for shape in [p] + [c.problem for c in cases]:
            key = (shape.batch, shape.seqlen_q, shape.seqlen_k, shape.num_heads, shape.num_heads_kv)
            if key not in seen:
                seen.add(key)
                shapes.append(shape)
    return shapes


def compile_gate_shapes(job: dict) -> dict:
    """Compile one candidate (search.evaluating.gpu_pipeline.compile_job) for all its shapes; {"status": ok | infeasible |
    compile_error, "reason", "static" (its first shape's kernel, judged against the target, with "arch"), ...}."""
    from fa4tune.config import BackwardConfig, ForwardConfig, Problem
    from fa4tune.fake_compile import compile_shapes, error_reason
    from fa4tune.harness.candidates import load_experiment
    from fa4tune.kernel_cache import compile_arch
    from fa4tune.static_check import StaticJob, facts_from_compile
    from fa4tune.targets import get_target

    start = time.perf_counter()
    kind = job["kind"]
    config = (ForwardConfig if kind == "fwd" else BackwardConfig).from_dict(job["config"])
    problems = [Problem.from_dict(p) for p in job["problems"]]
    shapes = gate_shapes(problems, job["gate_seed"], job["gate_random_problems"])
    try:
        kernel = compile_shapes(load_experiment(job["experiment_path"]), kind, config, shapes,
                                read_facts=job.get("read_facts", True))
    except Exception as err:  # the candidate's compile error is its result
        return {"status": "compile_error", "reason": error_reason(err), "seconds": time.perf_counter() - start}
    static_job = StaticJob(kind, config, problems[0].problem_class)
    if kernel.cubin_error:  # not cached, not fatal: the kernel is in the kernel cache
        static = facts_from_compile(static_job, get_target(job["target"]), "static_error", kernel.cubin_error)
    else:
        static = facts_from_compile(static_job, get_target(job["target"]), "ok", kernel=kernel.resources())
    facts = {**static.to_dict(), "arch": compile_arch()}
    facts.pop("cached")
    result = {
        "status": "ok", "reason": "", "arch": compile_arch(), "shapes": kernel.shapes, "seconds": time.perf_counter() - start,
        "kernels_compiled": kernel.kernels_compiled, "kernels_loaded": kernel.kernels_loaded, "static": facts,
    }
    if static.status == "infeasible":  # compiled shared storage over the target's capacity: off the GPU
        result.update(status="infeasible", reason=static.reason)
    return result
