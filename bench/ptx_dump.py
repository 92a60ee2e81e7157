"""The PTX of forward kernel configs, compiled on the CPU (fake tensors), one file per config: run it on two trees and
compare the folders. A kernel-class change whose PTX is byte-identical for every config it touches (a refactor)
compiles to the same kernels, so it needs no new GPU gate; any difference does.

    python3 bench/ptx_dump.py OUT_DIR [--arch sm_120a|sm_90a] [--configs NAME,...] [--dtype bf16|fp16] [--ir]
    git stash && python3 bench/ptx_dump.py /tmp/before && git stash pop && python3 bench/ptx_dump.py /tmp/after
    diff -r /tmp/before /tmp/after && echo identical

Each config runs through fa4tune.fake_compile.compile_shapes (the harness's host path) for the problem named beside
it, without the kernel cache, so every kernel is traced and compiled here. The DSL fixes its arch on import: one
arch per process (sm_90a is what an H200 emulating SM120 runs). `--ir` also writes the DSL's IR before lowering
(`<name>.mlir`, after canonicalize and cse): where two dumps' PTX differ, whether their CuTe programs do.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# name -> (kernel, tile_m, tile_n, num_threads, num_stages, Q_in_regs), problem (b, sq, sk, h, h_kv, d, causal)
CHUNKED_GQA = (1, 512, 8192, 32, 8, 128, True)
CONFIGS = {
    "tma_64x64_qr_chunked_gqa4": (("sm120_tma", 64, 64, 128, 1, True), CHUNKED_GQA),
    "tma_128x64_s2_noncausal": (("sm120_tma", 128, 64, 128, 2, False), (1, 1024, 1024, 16, 16, 128, False)),
    "tma_256x64_t256_causal": (("sm120_tma", 256, 64, 256, 1, False), (1, 1024, 1024, 16, 16, 128, True)),
    "tma_lpt_64x96_qr_chunked_gqa4": (("sm120_tma_lpt", 64, 96, 128, 1, True), CHUNKED_GQA),
    "tma_lpt_64x64_qr_prefill_gqa4": (("sm120_tma_lpt", 64, 64, 128, 1, True), (1, 4096, 4096, 32, 8, 128, True)),
    "tma_trimmed_64x64_qr_prefill_gqa4": (("sm120_tma_trimmed", 64, 64, 128, 1, True), (1, 4096, 4096, 32, 8, 128, True)),
    "tma_paired_64x96_qr_chunked_gqa4": (("sm120_tma_paired", 64, 96, 128, 1, True), CHUNKED_GQA),
    "tma_trimmed_64x96_qr_chunked_gqa4": (("sm120_tma_trimmed", 64, 96, 128, 1, True), CHUNKED_GQA),
    "sm120_128x64_causal": (("sm120", 128, 64, 128, 1, False), (1, 1024, 1024, 16, 16, 128, True)),
    "splitkv_32x64_decode": (("sm120_splitkv", 32, 64, 64, 2, False), (1, 1, 4096, 32, 8, 128, False)),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for <name>.ptx (created)")
    parser.add_argument("--arch", default="sm_120a", help="the DSL's arch (default sm_120a)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated names (default all: {','.join(CONFIGS)})")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"), help="the inputs' dtype (default bf16)")
    parser.add_argument("--ir", action="store_true", help="also write <name>.mlir, the DSL's IR before lowering")
    args = parser.parse_args(argv)
    names = [n for n in args.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown name(s) {unknown}; known: {sorted(CONFIGS)}")
    dump = Path(tempfile.mkdtemp(prefix="ptx-dump-"))
    os.environ.update(FLASH_ATTENTION_ARCH="sm_120", CUTE_DSL_ARCH=args.arch, FLASH_ATTENTION_NUM_SMS="132",
                      CUTE_DSL_KEEP="ir,ptx" if args.ir else "ptx", CUTE_DSL_DUMP_DIR=str(dump), PYTHONWARNINGS="ignore")
    os.environ.pop("FA4TUNE_KERNEL_CACHE", None)
    import warnings

    warnings.filterwarnings("ignore")
    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH as _EXPERIMENT

    experiment = load_experiment(_EXPERIMENT)  # the static rules and the pin first (guards.admit)
    from fa4tune import fake_compile
    from fa4tune.config import ForwardConfig, Problem

    fake_compile._clear_dumps = lambda: None  # compile_shapes removes the dumps after each call; the PTX is read below
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        (kernel, tile_m, tile_n, threads, stages, q_in_regs), (b, sq, sk, h, h_kv, d, causal) = CONFIGS[name]
        config = ForwardConfig(tile_m, tile_n, threads, stages, q_in_regs, kernel=kernel)
        for path in dump.glob("*"):
            path.unlink()
        fake_compile.compile_shapes(experiment, "fwd", config, [Problem(b, sq, sk, h, h_kv, d, d, causal, args.dtype)], read_facts=False)
        ptx = sorted(dump.glob("*.ptx"))  # a split config also compiles its combine kernel
        (args.out / f"{name}.ptx").write_text("".join(p.read_text() for p in ptx))
        if args.ir:
            (args.out / f"{name}.mlir").write_text("".join(p.read_text() for p in sorted(dump.glob("*.mlir"))))
        print(f"{name}: {len(ptx)} kernel(s), {sum(p.stat().st_size for p in ptx)} bytes of PTX", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
