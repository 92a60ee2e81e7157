"""Where a kernel compile's CPU time goes: the DSL's Python trace (IR generation) against its backend (MLIR passes,
LLVM, ptxas), per kernel, for the arch the DSL is told to compile for. CPU only (fake tensors).

    python3 bench/compile_profile.py [--arch sm_120a|sm_90a] [--classes d128-noncausal-bf16,...] [--kind fwd|bwd|both]

For each problem class: upstream's default config (fa4tune.defaults) and the dispatch table's, compiled once each
through fa4tune.fake_compile (the harness's host path) in this process, after one warm-up compile (imports, the DSL's
first-use setup). Prints per kernel: wall seconds, the trace's seconds (BaseDSL.generate_original_ir) and the
backend's (Compiler.compile), the cubin read for the facts (fa4tune.cubin.read_cubin: cuobjdump), and their totals. The static check compiles for sm_120a and an H200 compiles the same
kernels again for sm_90a: the trace is the part that both compiles repeat.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_CLASSES = "d128-noncausal-bf16,d128-causal-bf16,d64-noncausal-bf16,d128-noncausal-gqa4-decode-bf16"


def timed(owner, name: str, bucket: dict, key: str) -> None:
    """Wrap owner.name so that its wall seconds add up in bucket[key] (outermost calls only)."""
    original = getattr(owner, name)
    depth = [0]

    def wrapper(*args, **kwargs):
        depth[0] += 1
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                bucket[key] = bucket.get(key, 0.0) + time.perf_counter() - start

    setattr(owner, name, wrapper)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_120a", help="the arch the DSL compiles for (CUTE_DSL_ARCH)")
    parser.add_argument("--classes", default=DEFAULT_CLASSES, help="comma-separated problem class names")
    parser.add_argument("--kind", choices=("fwd", "bwd", "both"), default="both")
    args = parser.parse_args(argv)
    import tempfile

    # the cubins the facts are read from go to a folder of their own (fake_compile empties it after each compile)
    os.environ.update(CUTE_DSL_ARCH=args.arch, FLASH_ATTENTION_ARCH="sm_120", CUTE_DSL_KEEP="cubin",
                      CUTE_DSL_DUMP_DIR=tempfile.mkdtemp(prefix="fa4tune-compile-profile-"),
                      FLASH_ATTENTION_NUM_SMS=os.environ.get("FLASH_ATTENTION_NUM_SMS", "132"), CUDA_VISIBLE_DEVICES="")
    import warnings

    warnings.filterwarnings("ignore")
    from cutlass.base_dsl import compiler, dsl

    from fa4tune import cubin, defaults, fake_compile
    from fa4tune.config import ProblemClass
    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH

    bucket: dict = {}
    timed(dsl.BaseDSL, "generate_original_ir", bucket, "trace")
    timed(compiler.Compiler, "compile", bucket, "backend")
    timed(cubin, "read_cubin", bucket, "cubin")  # fake_compile imports it at each call, so it finds the wrapper
    experiment = load_experiment(EXPERIMENT_PATH)
    jobs = []
    for name in filter(None, args.classes.split(",")):
        pc = ProblemClass.parse(name)
        if args.kind in ("fwd", "both"):
            jobs += [("fwd", "upstream", defaults.upstream_forward(pc), pc), ("fwd", "table", experiment.forward_config(pc), pc)]
        if args.kind in ("bwd", "both") and pc.regime != "decode":
            jobs += [("bwd", "upstream", defaults.upstream_backward(pc), pc), ("bwd", "table", experiment.backward_config(pc), pc)]

    def compile_one(kind, cfg, pc):
        """As the static check compiles it (fa4tune.static_worker.compile_job): the class's static shape."""
        kernel = experiment.kernel_class(cfg) if kind == "fwd" else None
        fake_compile.compile_shapes(experiment, kind, cfg, [fake_compile.static_shape(pc, kernel)])

    compile_one(*(lambda k, _, c, p: (k, c, p))(*jobs[0]))  # warm-up: imports, the DSL's first-use setup
    print(f"arch {args.arch}; {len(jobs)} compiles after one warm-up", flush=True)
    print(f"{'kind':4}  {'config':8}  {'class':34}  {'wall s':>7}  {'trace s':>7}  {'backend s':>9}  {'cubin s':>7}")
    totals = {"wall": 0.0, "trace": 0.0, "backend": 0.0, "cubin": 0.0}
    seen = set()
    for kind, which, cfg, pc in jobs:
        if (kind, cfg.key(), pc.key()) in seen:  # the table's entry is upstream's config
            continue
        seen.add((kind, cfg.key(), pc.key()))
        bucket.clear()
        start = time.perf_counter()
        compile_one(kind, cfg, pc)
        wall = time.perf_counter() - start
        row = {"wall": wall, **{k: bucket.get(k, 0.0) for k in ("trace", "backend", "cubin")}}
        for k in totals:
            totals[k] += row[k]
        print(f"{kind:4}  {which:8}  {pc.name:34}  {wall:7.2f}  {row['trace']:7.2f}  {row['backend']:9.2f}  {row['cubin']:7.2f}",
              flush=True)
    share = lambda k: 100 * totals[k] / totals["wall"] if totals["wall"] else 0.0  # noqa: E731
    print(f"total: wall {totals['wall']:.1f} s, trace {totals['trace']:.1f} s ({share('trace'):.0f} %), "
          f"backend {totals['backend']:.1f} s ({share('backend'):.0f} %), cubin read {totals['cubin']:.1f} s ({share('cubin'):.0f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
