"""A static-check compiler process: reads jobs (JSON lines) on stdin, compiles each with fake tensors, answers on stdout.

Started by fa4tune.static_check with the environment that makes the DSL target sm_120a (it is read at import
time, so each worker is a fresh interpreter).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from fa4tune.config import BackwardConfig, ForwardConfig, ProblemClass
from fa4tune.static_check import COMPILE_SEQLEN, RESULT_PREFIX, StaticJob

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


_EXPERIMENTS: dict[str, object] = {}


def _load_experiment(path: str):
    """experiment.py loaded once per worker (its classes must stay the same objects between jobs)."""
    if path in _EXPERIMENTS:
        return _EXPERIMENTS[path]
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("experiment", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["experiment"] = module
    spec.loader.exec_module(module)
    _EXPERIMENTS[path] = module
    return module


class CubinUnreadable(RuntimeError):
    """The kernel compiled but its facts could not be read: not the config's fault."""


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
    try:
        facts = read_cubin(compiled[-1].__cubin__)
    except Exception as err:  # the kernel compiled; our reading of it failed (a missing cuobjdump, say)
        raise CubinUnreadable(traceback.format_exception_only(type(err), err)[-1].strip()) from err
    return dict(
        registers=facts.registers, stack_bytes=facts.stack_bytes, spill_store_bytes=facts.spill_store_bytes,
        spill_load_bytes=facts.spill_load_bytes, static_smem_bytes=facts.static_smem_bytes,
        dynamic_smem_bytes=_LAST_SMEM[-1] if _LAST_SMEM else 0, compile_seconds=seconds,
    )


def _worker_class_for(experiment):
    def class_for(config):
        return _recording_class(experiment.kernel_class(config))

    return class_for


def main(experiment_path: str) -> None:
    """Serve jobs until stdin closes."""
    import warnings

    warnings.filterwarnings("ignore")
    dump = Path(os.environ["CUTE_DSL_DUMP_DIR"])
    for line in sys.stdin:
        spec = json.loads(line)
        config_cls = ForwardConfig if spec["kind"] == "fwd" else BackwardConfig
        job = StaticJob(spec["kind"], config_cls.from_dict(spec["config"]), ProblemClass.from_dict(spec["problem_class"]))
        try:
            reply = {"status": "ok", "payload": _compile_in_worker(experiment_path, job)}
        except CubinUnreadable as err:
            reply = {"status": "unreadable", "payload": f"compiled, but its cubin could not be read: {err}"[:500]}
        except Exception as err:  # a compile error is a result, not a crash
            detail = traceback.format_exception_only(type(err), err)[-1].strip()
            reply = {"status": "error", "payload": detail[:500]}
        for f in dump.glob("*"):
            f.unlink(missing_ok=True)
        sys.stdout.write(RESULT_PREFIX + json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
