"""experiment.py's backward twin classes against the table's backward entries and upstream's SM120 default: per backward
problem of the suites, the three gated, then timed interleaved in one step (fa4tune.harness.steps.measure_step), the
list run twice with the order reversed; speedups from the mean medians. With --static (no GPU): the sm_120a static
facts of each entry and its twins. The twin since 2026-12-06 (session 7): "sm120_edge" (the mask on the tiles it
cuts only, kernels/edge_mask_backward_sm120.py) of each non-causal entry still on upstream's class; it won the d128
non-causal entry ("edge off" times that entry back on upstream's class), and its causal sibling "sm120_cmask_diag"
lost (2026-12-06-h100-s7-twins-ut.md; its twin line and data/2026-12-06-retired-cmask-diag.patch re-add it). Earlier
twins: K in registers for the dQ gemm ("sm120_cmask_kregs") won and graduated; heads first
(data/2026-12-06-heads-first-backward.patch) and V in registers (data/2026-12-06-vregs-backward.patch) lost and left
the tree; the 8-warp coordinate-mask twin became the causal d128 entries.

    uv run python docs/measurements/data/2026-12-05-heads-first-backward.py --static
    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 docs/measurements/data/2026-12-05-heads-first-backward.py
"""
import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from bench.common import compile_ahead, default_compile_jobs  # noqa: E402
from fa4tune import defaults  # noqa: E402
from fa4tune.config import BackwardConfig  # noqa: E402
from fa4tune.harness.candidates import experiment_candidate, load_experiment  # noqa: E402
from fa4tune.harness.settings import EXPERIMENT_PATH, Settings, new_gate_seed  # noqa: E402
from fa4tune.suites import load_suite  # noqa: E402

TWINS = {  # the table's backward entry, changed (None: no such twin); a twin that fails the static rules is left out
    # retired: "diagonal mask": lambda b, pc: replace(b, kernel="sm120_cmask_diag") if b.kernel == "sm120_cmask_kregs" else None,
    "edge mask": lambda b, pc: replace(b, kernel="sm120_edge") if b.kernel == "sm120" and not pc.causal else None,
    "edge off": lambda b, pc: replace(b, kernel="sm120") if b.kernel == "sm120_edge" else None,  # the entry it won
    # session 9: the non-causal studies' winners drawing sm120_edge (data/2026-12-06-h100-s9-bwd-edge.db.xz), and the
    # V-in-registers sweep's best at 256 threads (only with data/2026-12-06-vregs-backward.patch applied)
    "study winner": lambda b, pc: STUDY_WINNERS.get(pc.name),
    "vregs 256": lambda b, pc: VREGS_256 if pc.name == "d128-noncausal-bf16" else None,
    "vregs 0 spills": lambda b, pc: VREGS_0_SPILLS if pc.name == "d128-noncausal-bf16" else None,
}
_BWD = BackwardConfig(m_block_size=64, n_block_size=64, num_stages_Q=1, num_stages_dO=1, num_threads=128,
                      AtomLayoutMSdP=2, AtomLayoutNdKV=2, AtomLayoutMdQ=2, kernel="sm120_edge")
STUDY_WINNERS = {"d96-noncausal-bf16": replace(_BWD, dQ_swapAB=True),  # trial 23, 246.5 vs 240.9; the entry since s10
                 "d64-noncausal-bf16": replace(_BWD, num_threads=256, AtomLayoutMSdP=4, AtomLayoutNdKV=4,
                                               AtomLayoutMdQ=4)}  # trial 23, 215.8 vs 215.1
VREGS_256 = replace(_BWD, m_block_size=32, n_block_size=128, num_threads=256, dQ_swapAB=True, AtomLayoutMSdP=1,
                    AtomLayoutNdKV=2, AtomLayoutMdQ=1, V_in_regs=True, kernel="sm120_vregs")  # 298.2 TFLOPS, spills 12 B
VREGS_0_SPILLS = replace(VREGS_256, num_stages_Q=2, AtomLayoutNdKV=4)  # 290.0 TFLOPS, the sweep's best without spills
NAMES = ("table", *TWINS, "upstream")


def cases(experiment, suites):
    from fa4tune.feasibility import check_backward
    from fa4tune.targets import get_target

    for suite in suites:
        for p in load_suite(suite):
            if p.backward:
                pc = p.problem_class
                fwd, bwd = experiment.forward_config(pc), experiment.backward_config(pc)
                twins = {n: (fwd, twin(bwd, pc)) for n, twin in TWINS.items()}
                yield p, {"table": (fwd, bwd), **{n: c for n, c in twins.items()
                                                  if c[1] is not None and check_backward(c[1], pc, get_target("sm120"))},
                          "upstream": (defaults.upstream_forward(pc), defaults.upstream_backward(pc))}


def static(experiment, suites):
    from fa4tune.static_check import StaticJob, run_static
    from fa4tune.targets import get_target

    seen = {}
    for p, configs in cases(experiment, suites):
        seen.setdefault(p.problem_class, configs)
    jobs = [(pc, n, StaticJob("bwd", c[1], pc)) for pc, configs in seen.items() for n, c in configs.items() if n != "upstream"]
    facts = run_static([j for _, _, j in jobs], get_target("sm120"), EXPERIMENT_PATH)
    print("| class | kernel | registers | spill stores B | shared memory B | status |")
    print("|---|---|---|---|---|---|")
    for (pc, n, _), f in zip(jobs, facts):
        print(f"| {pc.name} | {n} | {f.registers} | {f.spill_store_bytes} | {f.dynamic_smem_bytes} | {f.status} {f.reason[:80]} |")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suites", default="standard,generalization")
    parser.add_argument("--static", action="store_true")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated substrings: the problems whose label has one "
                        "(one ending in $: the label itself)")
    args = parser.parse_args()
    experiment = load_experiment(EXPERIMENT_PATH)
    suites = args.suites.split(",")
    if args.static:
        static(experiment, suites)
        return 0
    import torch

    from fa4tune.harness.steps import make_flusher, measure_step

    settings = Settings(gate_seed=new_gate_seed())
    todo = [c for c in cases(experiment, suites) if not args.only or any(
        c[0].label == s[:-1] if s.endswith("$") else s in c[0].label for s in args.only.split(","))]
    compile_ahead([(k, c[i], p) for p, cs in todo for c in cs.values() for k, i in (("fwd", 0), ("bwd", 1))],
                  settings, default_compile_jobs())
    device = torch.device("cuda")
    flusher = make_flusher(device)
    ms = {}
    print("| problem | " + " | ".join(f"{n} ms" for n in NAMES) + " | " + " | ".join(f"{n} / table" for n in TWINS) + " |")
    print("|---" * (len(NAMES) + len(TWINS)) + "|---|", flush=True)
    ratios = {n: [] for n in (*TWINS, "upstream")}
    for p, configs in todo:  # each problem's runs back to back, its row printed at once (a call cut short keeps them)
        for run in range(args.runs):
            names = list(configs) if run % 2 == 0 else list(configs)[::-1]
            results = measure_step(p, "bwd", [experiment_candidate(experiment, *configs[n], name=n) for n in names],
                                   device=device, settings=settings, flusher=flusher)
            for n in names:
                r = results[n]
                ms.setdefault((p.label, n), []).append(r.ms_median if r.status == "ok" else math.nan)
                if r.status != "ok" and run == 0:
                    print(f"{p.label} {n}: {r.status} {r.reason[:200]}", flush=True)
        mean = {n: sum(ms[(p.label, n)]) / args.runs if (p.label, n) in ms else math.nan for n in NAMES}
        for n in ratios:
            ratios[n].append(mean["table"] / mean[n] if n != "upstream" else mean["upstream"] / mean["table"])
        print(f"| {p.label} | " + " | ".join(f"{mean[n]:.3f}" for n in NAMES) + " | "
              + " | ".join(f"{mean['table'] / mean[n]:.3f}x" for n in TWINS) + " |", flush=True)
    print(f"{torch.cuda.get_device_name(device)}, SM120 kernels emulated where not SM 12.0; gate seed {settings.gate_seed}")
    for name, values in ratios.items():
        good = [v for v in values if v == v]
        what = f"table over {name}" if name == "upstream" else f"{name} over the table"
        if good:
            print(f"geomean speedup of {what}: {math.exp(sum(map(math.log, good)) / len(good)):.3f}x ({len(good)} problems)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
