"""A fixed list of candidates compiled ahead, in CPU processes, into the on-disk kernel cache, for a script that then
gates and times them in one GPU process (the bench scripts): the compile pipeline of `search run`, without its
queue. The timing process sets `use_kernel_cache()` before any kernel class is built, so it loads each kernel.

    use_kernel_cache()
    precompile([("fwd", cfg, problems), ("bwd", bwd_cfg, problems)], settings, workers=15)

A job compiles one config for every shape the harness will call it on: the problems and their gate cases for
the settings' gate seed (search.evaluating.precompile). The other direction's kernel of a backward job is the
dispatch table's forward (what fa4tune.fake_compile runs); a candidate that pairs a backward with another
forward needs that forward as a job of its own.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Sequence


def use_kernel_cache() -> None:
    """This process loads kernels from the compile pipeline's disk cache (set before the kernel classes are built)."""
    from fa4tune.harness import gpu
    from fa4tune.targets import get_target
    from search.evaluating.gpu_pipeline import DEFAULT_CACHE, shared_env

    os.environ.update(shared_env(get_target(), gpu.read_device().num_sms, DEFAULT_CACHE))


def group_jobs(pairs: Sequence[tuple[str, object, object]]) -> list[tuple[str, object, list]]:
    """(kind, config, problem) pairs as one job per (kind, config, head_dim, GQA ratio), so that jobs sharing a
    compile key rarely run at once."""
    groups: dict = {}
    for kind, cfg, p in pairs:
        key = (kind, repr(cfg), p.head_dim, p.num_heads // p.num_heads_kv)
        groups.setdefault(key, (kind, cfg, []))[2].append(p)
    return list(groups.values())


def precompile(jobs: Sequence[tuple[str, object, list]], settings, workers: int,
               name: Callable[[object], str] = repr, log: Callable[[str], None] = print) -> list[dict]:
    """Every job compiled in `workers` CPU processes into the kernel cache; the compile replies, in job order.
    A job that fails to compile is logged; its candidate fails where it runs (compile error in the gate)."""
    from fa4tune.harness import gpu
    from fa4tune.harness.settings import EXPERIMENT_PATH
    from fa4tune.kernel_cache import device_arch
    from fa4tune.targets import get_target
    from search.evaluating.gpu_pipeline import COMPILE_FUNCTION, DEFAULT_CACHE, compile_env, compile_job
    from search.evaluating.pipeline import CompilePool

    info, target = gpu.read_device(), get_target()
    start = time.perf_counter()
    pool = CompilePool(COMPILE_FUNCTION, workers, env=compile_env(target, info.capability, info.num_sms, DEFAULT_CACHE))
    try:
        futures = [pool.submit(compile_job(kind, cfg, problems, target, str(EXPERIMENT_PATH), settings.gate_seed,
                                           settings.gate_random_problems, device_arch(*info.capability)))
                   for kind, cfg, problems in jobs]
        replies = [f.result() for f in futures]
    finally:
        pool.close()
    compiled = sum(r.get("kernels_compiled") or 0 for r in replies)
    log(f"precompiled {len(jobs)} jobs ({compiled} kernels) in {time.perf_counter() - start:.0f} s with {workers} processes")
    for (kind, cfg, problems), reply in zip(jobs, replies):
        if reply["status"] != "ok":
            log(f"  {kind} {name(cfg)} d{problems[0].head_dim}: {reply['status']}: {reply.get('reason', '')[:300]}")
    return replies
