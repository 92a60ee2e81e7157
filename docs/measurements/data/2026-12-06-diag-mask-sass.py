"""The backward's main loop with the mask on every query block against the tiles it cuts only (issue 44, CPU).

    uv run python docs/measurements/data/2026-12-06-diag-mask-sass.py [--arch sm_120a|sm_90a]

Compiles the d128 causal and GQA 4 entries (`sm120_cmask_kregs`) and their twins on `sm120_cmask_diag`, and the
d128 non-causal entry (`sm120`) and its twin on `sm120_edge` (experiment.py's MaskWhereCut: each query block traced
with the mask and without, under one branch on whether the mask cuts the tile), for sm_120a or sm_90a, through fa4tune.fake_compile (fake tensors, no GPU). For each it prints the registers, the spills,
the main loop's instructions (the innermost backward branch with >= 64 HMMA, bench/sass_loops.main_loops) and the
longest forward branch inside that loop that jumps over instructions (the mask skipped off the diagonal), with the
FSEL (select) count of the loop and of that region. Record: docs/measurements/2026-12-06-diag-mask-static.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

CLASSES = {"d128-causal-bf16": "sm120_cmask_diag", "d128-causal-gqa4-bf16": "sm120_cmask_diag",
           "d128-noncausal-bf16": "sm120_edge"}  # class: its entry's twin


def skipped_region(body: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The instructions the longest predicated forward branch of a loop body jumps over (empty: none)."""
    best: list[tuple[int, str]] = []
    for i, (_, ins) in enumerate(body):
        if not ins.startswith("@") or " BRA " not in f" {ins} ":
            continue
        m = re.search(r"0x([0-9a-f]+)", ins)
        if not m:
            continue
        target = int(m.group(1), 16)
        region = [x for x in body[i + 1:] if x[0] < target]
        if body[-1][0] >= target > body[i][0] and len(region) > len(best):
            best = region
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_120a", choices=("sm_120a", "sm_90a"))
    parser.add_argument("--loops", type=Path, default=None, help="a folder to write each main loop's SASS into")
    args = parser.parse_args(argv)
    dump = Path(tempfile.mkdtemp(prefix="diag-sass-"))
    if "cutlass" in sys.modules:
        raise RuntimeError("the DSL fixes its arch on import: run this script in a process of its own")
    os.environ.update(FLASH_ATTENTION_ARCH="sm_120", CUTE_DSL_ARCH=args.arch, FLASH_ATTENTION_NUM_SMS="132",
                      CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=str(dump), PYTHONWARNINGS="ignore")
    os.environ.pop("FA4TUNE_KERNEL_CACHE", None)
    warnings.filterwarnings("ignore")
    from bench.sass_loops import main_loops, opcode, parse_sass
    from fa4tune import fake_compile
    from fa4tune.config import Problem
    from fa4tune.cubin import read_cubin, tool_path
    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH

    experiment = load_experiment(EXPERIMENT_PATH)
    fake_compile._clear_dumps = lambda: None
    print(f"arch {args.arch}\n")
    print("| class | kernel | registers | spills st / ld B | loop instructions | loop FSEL | the longest skipped region: "
          "instructions | FSEL |\n|---|---|---|---|---|---|---|---|")
    for name, twin in CLASSES.items():
        entry = experiment.BACKWARD_DISPATCH[name]
        gqa = 4 if "gqa4" in name else 1
        problem = Problem(1, 1024, 1024, 2 * gqa, 2, 128, 128, "noncausal" not in name)
        for kernel in (entry.kernel, twin):
            for path in dump.glob("*"):
                path.unlink()
            fake_compile.compile_shapes(experiment, "bwd", replace(entry, kernel=kernel), [problem], read_facts=False)
            main = []
            for cubin in sorted(dump.glob("*.cubin")):
                sass = subprocess.run([str(tool_path("cuobjdump")), "-sass", str(cubin)], capture_output=True,
                                      text=True, check=True, timeout=120).stdout
                loops = main_loops(parse_sass(sass))
                if loops:
                    main.append((read_cubin(cubin.read_bytes()), loops[-1]))
            facts, body = main[0]
            if args.loops:
                args.loops.mkdir(parents=True, exist_ok=True)
                (args.loops / f"{name}-{kernel}.sass").write_text("".join(f"/*{a:04x}*/ {i}\n" for a, i in body))
            region = skipped_region(body)
            fsel = sum(opcode(ins) == "FSEL" for _, ins in body)
            print(f"| {name} | {kernel} | {facts.registers} | {facts.spill_store_bytes} / {facts.spill_load_bytes} | "
                  f"{len(body)} | {fsel} | {len(region)} | {sum(opcode(ins) == 'FSEL' for _, ins in region)} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
