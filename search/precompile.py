"""The compile stage of the pipeline: one candidate compiled with fake tensors (CPU only), for every shape
the GPU process will run, into the on-disk kernel cache (fa4tune.kernel_cache).

Runs in a compiler process of search.pipeline, whose environment names the arch and the cache
(FA4TUNE_KERNEL_CACHE, CUTE_DSL_ARCH, FLASH_ATTENTION_ARCH, FLASH_ATTENTION_NUM_SMS) before the DSL is
imported. The shapes are the GPU's: each problem and its gate cases for the pipeline's gate seed
(prepare's constants), through experiment.attention as the harness calls it, so that the compile keys are
the harness's. A compile error, or a kernel whose compiled shared storage exceeds the target's, ends here:
it never reaches the GPU.
"""

from __future__ import annotations

import math
import os
import time
import traceback
from pathlib import Path

_RECORDED_SMEM: list[int] = []
_PATCHED: set[type] = set()


def _record_shared_storage(cls: type) -> None:
    """Notes the shared-storage size a kernel class asks for (the class itself, so compile keys do not change)."""
    if cls in _PATCHED:
        return
    original = cls._get_shared_storage_cls

    def _get_shared_storage_cls(self):
        storage = original(self)
        _RECORDED_SMEM.append(int(storage.size_in_bytes()))
        return storage

    cls._get_shared_storage_cls = _get_shared_storage_cls
    _PATCHED.add(cls)


def gate_shapes(problems, gate_seed: int, random_problems: int) -> list:
    """The problems and their gate cases' shapes, without repeats, as the harness builds them."""
    import prepare
    from fa4tune import gate

    shapes, seen = [], set()
    for p in problems:
        cases = gate.gate_cases(p, gate_seed, scale=prepare.GATE_SCALE, seqlen_offset=prepare.GATE_SEQLEN_OFFSET,
                                random_count=random_problems, random_max_seqlen=prepare.GATE_RANDOM_MAX_SEQLEN)
        for shape in [p] + [c.problem for c in cases]:
            key = (shape.batch, shape.seqlen_q, shape.seqlen_k, shape.num_heads, shape.num_heads_kv)
            if key not in seen:
                seen.add(key)
                shapes.append(shape)
    return shapes


def _run_shape(experiment, kind: str, problem, fwd_config, bwd_config) -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fa4tune.gate import TORCH_DTYPES
    from fa4tune.sm120_interface import build

    dtype = TORCH_DTYPES[problem.dtype]
    with FakeTensorMode():
        q = torch.empty(problem.batch, problem.seqlen_q, problem.num_heads, problem.head_dim, dtype=dtype, device="cuda")
        k = torch.empty(problem.batch, problem.seqlen_k, problem.num_heads_kv, problem.head_dim, dtype=dtype, device="cuda")
        v = torch.empty(problem.batch, problem.seqlen_k, problem.num_heads_kv, problem.head_dim_v, dtype=dtype, device="cuda")
        if kind == "fwd":
            with torch.no_grad():
                experiment.attention(q, k, v, causal=problem.causal, fwd_config=fwd_config, bwd_config=bwd_config, return_lse=True)
            return
        # autograd on fake CUDA tensors needs a device; call the host path as experiment._Attention.backward does
        host = build(experiment.kernel_class)
        scale = 1.0 / math.sqrt(problem.head_dim)
        out, lse, *_ = host.flash_attn_fwd(q, k, v, softmax_scale=scale, causal=problem.causal,
                                           tile_mn=(fwd_config.tile_m, fwd_config.tile_n), return_lse=True, sm120_config=fwd_config)
        host.flash_attn_bwd(q, k, v, out, torch.empty_like(out), lse, softmax_scale=scale, causal=problem.causal, sm120_config=bwd_config)


def compile_candidate(job: dict) -> dict:
    """Compile one candidate for all its shapes; {"status": ok | infeasible | compile_error, "reason", "static", ...}."""
    import prepare
    from fa4tune.config import BackwardConfig, ForwardConfig, Problem
    from fa4tune.sm120_interface import build

    start = time.perf_counter()
    kind = job["kind"]
    config = (ForwardConfig if kind == "fwd" else BackwardConfig).from_dict(job["config"])
    problems = [Problem.from_dict(p) for p in job["problems"]]
    experiment = prepare.load_experiment(job["experiment_path"])
    pc = problems[0].problem_class
    fwd_config, bwd_config = (config, experiment.backward_config(pc)) if kind == "fwd" else (experiment.forward_config(pc), config)
    _record_shared_storage(experiment.kernel_class(config))
    host = build(experiment.kernel_class)
    cache = host.fwd_cache if kind == "fwd" else host.bwd_cache
    compiled: dict = {}
    cache.listeners.append(compiled.__setitem__)
    counts = (getattr(cache, "compiled", 0), getattr(cache, "loaded", 0), len(getattr(cache, "used", [])))
    _RECORDED_SMEM.clear()
    shapes = gate_shapes(problems, job["gate_seed"], job["gate_random_problems"])
    try:
        for shape in shapes:
            _run_shape(experiment, kind, shape, fwd_config, bwd_config)
    except Exception as err:  # the candidate's compile error is its result
        reason = traceback.format_exception_only(type(err), err)[-1].strip()[:500]
        return {"status": "compile_error", "reason": reason, "seconds": time.perf_counter() - start}
    finally:
        cache.listeners.remove(compiled.__setitem__)
        _clear_dumps()
    result = {
        "status": "ok", "reason": "", "shapes": len(shapes), "seconds": time.perf_counter() - start,
        "kernels_compiled": getattr(cache, "compiled", 0) - counts[0], "kernels_loaded": getattr(cache, "loaded", 0) - counts[1],
    }
    used = getattr(cache, "used", [])[counts[2]:]
    facts = _facts(cache, used[0], compiled, job, config, pc) if used else None
    if facts is not None:
        result["static"] = facts
        if facts["status"] == "infeasible":  # compiled shared storage over the target's capacity: off the GPU
            result.update(status="infeasible", reason=facts["reason"])
    return result


def _clear_dumps() -> None:
    """Removes the cubin/ptx files CUTE_DSL_KEEP left (the facts are read from the compiled function)."""
    dump = os.environ.get("CUTE_DSL_DUMP_DIR")
    if dump and os.environ.get("CUTE_DSL_KEEP"):
        for path in Path(dump).glob("*"):
            path.unlink(missing_ok=True)


def _facts(cache, key, compiled: dict, job: dict, config, pc) -> dict | None:
    """Static facts of the candidate's kernel (its first shape's): from its cubin when compiled here, else as stored."""
    from fa4tune.cubin import read_cubin
    from fa4tune.static_check import StaticJob, _finish
    from fa4tune.targets import get_target

    if key not in compiled:
        return cache.read_facts(key)
    payload = dict(registers=0, stack_bytes=0, spill_store_bytes=0, spill_load_bytes=0, static_smem_bytes=0,
                   dynamic_smem_bytes=max(_RECORDED_SMEM, default=0), compile_seconds=0.0)
    if getattr(compiled[key], "__cubin__", None):  # kept when CUTE_DSL_KEEP names cubin
        try:
            cubin = read_cubin(compiled[key].__cubin__)
        except Exception as err:  # the kernel compiled; reading it failed (a missing cuobjdump): not cached, not fatal
            reason = traceback.format_exception_only(type(err), err)[-1].strip()[:500]
            return {"status": "static_error", "reason": f"compiled, but its cubin could not be read: {reason}", "arch": job.get("arch", "")}
        payload.update(registers=cubin.registers, stack_bytes=cubin.stack_bytes, spill_store_bytes=cubin.spill_store_bytes,
                       spill_load_bytes=cubin.spill_load_bytes, static_smem_bytes=cubin.static_smem_bytes)
    facts = {**_finish(StaticJob(job["kind"], config, pc), get_target(job["target"]), "ok", payload).to_dict(), "arch": job.get("arch", "")}
    facts.pop("cached", None)
    cache.write_facts(key, facts)
    return facts
