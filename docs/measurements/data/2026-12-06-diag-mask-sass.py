"""The backward's main loop with the mask on every query block against the tiles it cuts only (issue 44, CPU).

    uv run python docs/measurements/data/2026-12-06-diag-mask-sass.py [--arch sm_120a|sm_90a] [--opcodes]

Compiles the d128 causal and GQA 4 entries (`sm120_cmask_kregs`) and their twins on `sm120_cmask_diag`, and the
d128 non-causal entry (`sm120`) and its twin on `sm120_edge` (MaskWhereCut: each query block traced
with the mask and without, under one branch on whether the mask cuts the tile), for sm_120a or sm_90a, through fa4tune.fake_compile (fake tensors, no GPU). For each it prints the registers, the spills,
the main loop's instructions (the innermost backward branch with >= 64 HMMA, bench/sass_loops.main_loops) and its
FSEL (select) count; for a twin also the instructions of its two paths through the loop (`paths`: the masked copy
with the common head and tail, and the unmasked one), and the unmasked path against the entry's loop. Record: docs/measurements/2026-12-06-diag-mask-static.md.
Since 2026-12-06 (session 7) `sm120_cmask_diag` is retired (it lost, 2026-12-06-h100-s7-twins-ut.md): its rows need
`git apply docs/measurements/data/2026-12-06-retired-cmask-diag.patch`; `sm120_edge` is kernels/edge_mask_backward_sm120.py
and the non-causal d128 entry's kernel.
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

CLASSES = {"d128-causal-bf16": ("sm120_cmask_kregs", "sm120_cmask_diag"),
           "d128-causal-gqa4-bf16": ("sm120_cmask_kregs", "sm120_cmask_diag"),
           "d128-noncausal-bf16": ("sm120", "sm120_edge")}  # class: (the entry's kernel when this ran, its twin)


def paths(body: list[tuple[int, str]]) -> tuple[list, list] | None:
    """A twin's loop body as its two paths, (masked, unmasked): the body's first forward branch (to the unmasked
    copy) and the unconditional branch that ends the copy before it (to the common tail); None: no such pair."""
    from bench.sass_loops import opcode

    addresses = [a for a, _ in body]
    first = next((j for j, (_, ins) in enumerate(body) if opcode(ins).startswith("BRA")), None)
    last = next((j for j, (_, ins) in enumerate(body) if re.match(r"BRA 0x", ins)), None)
    if first is None or last is None:
        return None
    to_else, to_tail = (int(re.search(r"0x([0-9a-f]+)", body[j][1]).group(1), 16) for j in (first, last))
    if to_else not in addresses or to_tail not in addresses:
        return None
    k_else, k_tail = addresses.index(to_else), addresses.index(to_tail)
    one = body[:last + 1] + body[k_tail:]
    other = body[:first + 1] + body[k_else:]
    fsel = [sum(opcode(ins) == "FSEL" for _, ins in path) for path in (one, other)]
    return (one, other) if fsel[0] >= fsel[1] else (other, one)


def opcode_changes(entry: list, masked: list, unmasked: list) -> list[str]:
    """The opcodes (without modifiers) whose count differs between the entry's loop and a twin's paths."""
    from collections import Counter

    from bench.sass_loops import opcode

    counts = [Counter(opcode(ins).split(".")[0] for _, ins in body) for body in (entry, masked, unmasked)]
    names = sorted(set().union(*counts), key=lambda k: (-counts[0][k], k))
    return [f"{k} {counts[0][k]} / {counts[1][k]} / {counts[2][k]}" for k in names
            if not counts[0][k] == counts[1][k] == counts[2][k]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_120a", choices=("sm_120a", "sm_90a"))
    parser.add_argument("--loops", type=Path, default=None, help="a folder to write each main loop's SASS into")
    parser.add_argument("--opcodes", action="store_true", help="also the opcodes whose count differs between each "
                        "entry's loop and its twin's paths")
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
    changes = []
    print("| class | kernel | registers | spills st / ld B | loop instructions | loop FSEL | masked path | unmasked path "
          "| unmasked / entry's loop |\n|---|---|---|---|---|---|---|---|---|")
    from fa4tune.kernel_class import backward_kernels

    for name, (base, twin) in CLASSES.items():
        if twin not in backward_kernels(experiment):
            print(f"| {name} | {twin} | not registered: apply data/2026-12-06-retired-cmask-diag.patch |")
            continue
        entry = replace(experiment.BACKWARD_DISPATCH[name], kernel=base)
        gqa = 4 if "gqa4" in name else 1
        problem = Problem(1, 1024, 1024, 2 * gqa, 2, 128, 128, "noncausal" not in name)
        entry_loop = entry_body = None
        for kernel in (base, twin):
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
            fsel = sum(opcode(ins) == "FSEL" for _, ins in body)
            split = paths(body) if kernel == twin else None
            shown = (f"{len(split[0])} | {len(split[1])} | {len(split[1]) / entry_loop - 1:+.1%}" if split
                     else "- | - | -")
            print(f"| {name} | {kernel} | {facts.registers} | {facts.spill_store_bytes} / {facts.spill_load_bytes} | "
                  f"{len(body)} | {fsel} | {shown} |", flush=True)
            if split and args.opcodes:
                changes.append(f"{name}: " + ", ".join(opcode_changes(entry_body, *split)))
            entry_loop, entry_body = entry_loop or len(body), entry_body or body
    if changes:
        print("\nopcodes whose count differs (entry's loop / masked path / unmasked path; every other opcode, LDSM, "
              "HMMA, BAR and memory ones included, the same):\n" + "\n".join(changes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
