"""experiment.py's heads-first backward (kernel "sm120_heads_first") against the table's backward entry it reorders
and upstream's SM120 default: per backward problem of the suites, the three gated, then timed interleaved in one step
(fa4tune.harness.steps.measure_step), the list run twice with the order reversed; speedups from the mean medians.
With --static (no GPU): the sm_120a static facts of each entry and its heads-first twin.

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
from fa4tune.harness.candidates import experiment_candidate, load_experiment  # noqa: E402
from fa4tune.harness.settings import EXPERIMENT_PATH, Settings, new_gate_seed  # noqa: E402
from fa4tune.suites import load_suite  # noqa: E402

NAMES = ("table", "heads first", "upstream")


def cases(experiment, suites):
    for suite in suites:
        for p in load_suite(suite):
            if p.backward:
                pc = p.problem_class
                fwd, bwd = experiment.forward_config(pc), experiment.backward_config(pc)
                yield p, {"table": (fwd, bwd), "heads first": (fwd, replace(bwd, kernel="sm120_heads_first")),
                          "upstream": (defaults.upstream_forward(pc), defaults.upstream_backward(pc))}


def static(experiment, suites):
    from fa4tune.static_check import StaticJob, run_static
    from fa4tune.targets import get_target

    seen = {}
    for p, configs in cases(experiment, suites):
        seen.setdefault(p.problem_class, configs)
    jobs = [StaticJob("bwd", configs[n][1], pc) for pc, configs in seen.items() for n in ("table", "heads first")]
    facts = run_static(jobs, get_target("sm120"), EXPERIMENT_PATH)
    print("| class | table entry: registers / spill stores B | heads first: registers / spill stores B | shared memory B |")
    print("|---|---|---|---|")
    for (pc, _), (a, b) in zip(seen.items(), zip(facts[0::2], facts[1::2])):
        print(f"| {pc.name} | {a.registers} / {a.spill_store_bytes} | {b.registers} / {b.spill_store_bytes} | "
              f"{a.dynamic_smem_bytes} / {b.dynamic_smem_bytes} |")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suites", default="standard,generalization")
    parser.add_argument("--static", action="store_true")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    experiment = load_experiment(EXPERIMENT_PATH)
    suites = args.suites.split(",")
    if args.static:
        static(experiment, suites)
        return 0
    import torch

    from fa4tune.harness.steps import make_flusher, measure_step

    settings = Settings(gate_seed=new_gate_seed())
    todo = list(cases(experiment, suites))
    compile_ahead([(k, c[i], p) for p, cs in todo for c in cs.values() for k, i in (("fwd", 0), ("bwd", 1))],
                  settings, default_compile_jobs())
    device = torch.device("cuda")
    flusher = make_flusher(device)
    ms = {}
    for run in range(args.runs):
        for p, configs in todo:
            names = NAMES if run % 2 == 0 else NAMES[::-1]
            results = measure_step(p, "bwd", [experiment_candidate(experiment, *configs[n], name=n) for n in names],
                                   device=device, settings=settings, flusher=flusher)
            for n in names:
                r = results[n]
                ms.setdefault((p.label, n), []).append(r.ms_median if r.status == "ok" else math.nan)
                if r.status != "ok":
                    print(f"{p.label} {n}: {r.status} {r.reason[:200]}", flush=True)
    print(f"{torch.cuda.get_device_name(device)}, SM120 kernels emulated where not SM 12.0; gate seed {settings.gate_seed}")
    print("| problem | table ms | heads first ms | upstream ms | heads first / table | heads first / upstream |")
    print("|---|---|---|---|---|---|")
    ratios = {"table": [], "upstream": []}
    for p, _ in todo:
        t, h, u = (sum(ms[(p.label, n)]) / args.runs for n in NAMES)
        ratios["table"].append(t / h)
        ratios["upstream"].append(u / h)
        print(f"| {p.label} | {t:.3f} | {h:.3f} | {u:.3f} | {t / h:.3f}x | {u / h:.3f}x |")
    for name, values in ratios.items():
        good = [v for v in values if v == v]
        print(f"geomean speedup of heads first over {name}: {math.exp(sum(map(math.log, good)) / len(good)):.3f}x "
              f"({len(good)} problems)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
