"""Run-to-run spread of the harness's timing on short problems, without and with the blocking kernel.

    . /opt/devsite/env.sh && python3 bench/stability.py --runs 3 --out $OUT/stability.json

Every (problem, direction) of the suite goes through fa4tune.harness.steps.measure_step with its Settings (gate, then
the timed rounds, L2 flushed before each call) and experiment.py's dispatch table configs: what the harness
measures. Each run measures the whole suite once per timing mode, interleaved (before run 1, after run 1,
before run 2, ...): "before" is CudaEventTimer(block=False), the old schedule whose first calls of a round
start on an idle GPU and include the host's launch time; "after" is CudaEventTimer(block=True), every round
behind a blocking kernel. The inputs are the same in every run (one gate seed), so the spread of the medians
across runs is the timer's. The table gives per problem and direction each run's median ms and TFLOPS and
the spread ((max - min) / min of the medians); a summary line per mode gives the worst spread and how many
rows stay within 3 %. On a GPU that is not SM 12.0 the SM120 kernels run emulated (FLASH_ATTENTION_ARCH /
FLASH_ATTENTION_NUM_SMS are set from fa4tune.harness.gpu.kernel_env before the kernels are imported).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODES = {"before": False, "after": True}  # mode name -> CudaEventTimer(block=...)
WITHIN_PERCENT = 3.0  # a row is stable when its medians' spread across runs is at most this


def spread_percent(medians: Sequence[float]) -> float:
    """(max - min) / min of the medians, in percent (0 for a single run)."""
    return (max(medians) - min(medians)) / min(medians) * 100


def rows(records: Sequence[dict]) -> list[dict]:
    """One row per (problem, direction, mode), in first-seen order: its records by run and the spread
    (None when some run was not ok)."""
    grouped: dict[tuple, dict] = {}
    for r in records:
        key = (r["problem"], r["direction"], r["mode"])
        row = grouped.setdefault(key, {"problem": r["problem"], "direction": r["direction"], "mode": r["mode"], "runs": {}})
        row["runs"][r["run"]] = r
    for row in grouped.values():
        runs = list(row["runs"].values())
        ok = all(r["status"] == "ok" for r in runs)
        row["spread_percent"] = spread_percent([r["ms_median"] for r in runs]) if ok else None
        row["rounds_redone"] = sum(r.get("timer", {}).get("rounds_redone", 0) for r in runs)
    return list(grouped.values())


def summary(table: Sequence[dict], within: float = WITHIN_PERCENT) -> dict[str, dict]:
    """Per mode: rows, rows measured ok in every run, rows within `within` %, the worst spread and its row."""
    out: dict[str, dict] = {}
    for row in table:
        s = out.setdefault(row["mode"], {"rows": 0, "ok": 0, "within": 0, "worst_spread_percent": None, "worst": ""})
        s["rows"] += 1
        spread = row["spread_percent"]
        if spread is None:
            continue
        s["ok"] += 1
        s["within"] += spread <= within
        if s["worst_spread_percent"] is None or spread > s["worst_spread_percent"]:
            s["worst_spread_percent"], s["worst"] = spread, f"{row['direction']} {row['problem']}"
    return out


def format_table(table: Sequence[dict], runs: int) -> str:
    """The table as text: problem, direction, mode, each run's median ms and TFLOPS, spread %, rounds redone."""
    header = ["problem", "dir", "mode"]
    for i in range(1, runs + 1):
        header += [f"run{i} ms", f"run{i} TFLOPS"]
    header += ["spread %", "redone"]
    lines = [header]
    for row in table:
        cells = [row["problem"], row["direction"], row["mode"]]
        for i in range(1, runs + 1):
            r = row["runs"].get(i)
            if r is None:
                cells += ["", ""]
            elif r["status"] != "ok":
                cells += [r["status"], ""]
            else:
                cells += [f"{r['ms_median']:.4f}", f"{r['tflops']:.1f}"]
        cells += ["" if row["spread_percent"] is None else f"{row['spread_percent']:.1f}", str(row["rounds_redone"])]
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def summary_lines(by_mode: dict[str, dict], within: float = WITHIN_PERCENT) -> list[str]:
    """One line per mode: worst spread (and where), rows within `within` %, rows not ok in some run."""
    lines = []
    for mode, s in by_mode.items():
        worst = "n/a" if s["worst_spread_percent"] is None else f"{s['worst_spread_percent']:.1f} % ({s['worst']})"
        not_ok = s["rows"] - s["ok"]
        lines.append(
            f"{mode} (block={MODES.get(mode)}): worst spread {worst}; {s['within']}/{s['rows']} within {within:g} %"
            + (f"; {not_ok} not ok in some run" if not_ok else "")
        )
    return lines


def record(run: int, mode: str, result, timer_stats: dict) -> dict:
    """The JSON record of one measured step (a harness ProblemResult and the timer's stats)."""
    return {"run": run, "mode": mode, **result.to_dict(), "timer": timer_stats}


def measure(problems, directions: Sequence[str], runs: int, settings, experiment, flusher, on_record=None) -> list[dict]:
    """Every (run, mode, problem, direction) through fa4tune.harness.steps.measure_step, modes interleaved within each run."""
    from fa4tune.harness import candidates, evaluation, steps, timing
    from fa4tune.harness.measurement import ProblemResult
    from fa4tune.targets import get_target

    target = get_target()
    records = []
    for run in range(1, runs + 1):
        for mode, block in MODES.items():
            for problem in problems:
                for direction in directions:
                    if direction == "bwd" and not problem.backward:
                        continue
                    pc = problem.problem_class
                    fwd_config, bwd_config = experiment.forward_config(pc), experiment.backward_config(pc)
                    timer = timing.CudaEventTimer(block=block)
                    failure = evaluation.feasibility_failure(direction, fwd_config, bwd_config, problem, target)
                    lost = False
                    if failure:
                        result = ProblemResult(problem.label, direction, "infeasible", reason=failure)
                    else:
                        candidate = candidates.experiment_candidate(experiment, fwd_config, bwd_config)
                        try:
                            step = steps.measure_step(problem, direction, [candidate], device="cuda", settings=settings,
                                                        timer=timer, flusher=flusher)
                        except steps.StepContextLost as fault:
                            step, lost = fault.results, True
                        result = step[candidate.name]
                    records.append(record(run, mode, result, timer.stats.to_dict()))
                    if on_record is not None:
                        on_record(records[-1])
                    if lost:
                        print("a device fault ended this process's CUDA context: stopping here", file=sys.stderr, flush=True)
                        return records
    return records


def _progress(r: dict) -> None:
    speed = f"{r['ms_median']:.4f} ms {r['tflops']:.1f} TFLOPS" if r["status"] == "ok" else f"{r['status']}: {r['reason'][:120]}"
    stats = r["timer"]
    print(f"run {r['run']} {r['mode']:6s} {r['direction']} {r['problem']:26s} {speed} "
          f"(rounds redone {stats['rounds_redone']}, blocking {stats['block_ms_total']:.2f} ms)", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="short")
    parser.add_argument("--only", default="", help="only problems whose label contains this")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--directions", default="fwd,bwd", help="fwd, bwd or fwd,bwd")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per step (default: fa4tune.harness.settings.TIMED_ROUNDS)")
    parser.add_argument("--out", type=Path, default=None, help="write the raw records and the summary as JSON here")
    args = parser.parse_args(argv)

    from fa4tune.harness import gpu
    from fa4tune.suites import load_suite
    from fa4tune.targets import get_target

    problems = [p for p in load_suite(args.suite) if args.only in p.label]
    directions = [d for d in args.directions.split(",") if d]
    info = gpu.read_device()
    target = get_target()
    mode = gpu.select_mode(info, target)
    # before the kernels are imported: upstream reads the arch once (emulated on a GPU that is not SM 12.0)
    os.environ.update(gpu.kernel_env(info, target, mode))

    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH as _EXPERIMENT

    experiment = load_experiment(_EXPERIMENT)  # the static rules and the pin first (guards.admit), as every measuring path
    from fa4tune.harness.settings import Settings, new_gate_seed

    settings = Settings(gate_seed=new_gate_seed())
    if args.rounds:
        settings = dataclasses.replace(settings, rounds=args.rounds)
    label = gpu.run_label(target, info.name, mode)
    clocks_start = gpu.read_clocks(info.index).short()
    print(f"# {label}; suite {args.suite} ({len(problems)} problems, {','.join(directions)}); {args.runs} runs per mode; "
          f"gate seed {settings.gate_seed}; {settings.warmup} warm-up calls, {settings.rounds} rounds x "
          f"{settings.input_sets} input sets; clocks at start: {clocks_start}", flush=True)
    started = time.time()
    report = {
        "command": " ".join(["python3", "bench/stability.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "label": label, "device": info.name,
        "mode": mode, "suite": args.suite, "runs": args.runs, "settings": settings.to_dict(), "records": [],
    }

    def save(_record=None):
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1))

    def on_record(r):
        _progress(r)
        report["records"].append(r)
        save()

    import torch

    from fa4tune.harness import timing

    # the harness's flush: at least twice the L2, written before every timed call
    flusher = timing.L2Flusher(timing.l2_flush_bytes(torch.cuda.get_device_properties(info.index).L2_cache_size))
    measure(problems, directions, args.runs, settings, experiment, flusher, on_record=on_record)
    table = rows(report["records"])
    by_mode = summary(table)
    report["summary"] = by_mode
    report["clocks"] = {"start": clocks_start, "end": gpu.read_clocks(info.index).short()}
    report["seconds"] = round(time.time() - started, 1)
    save()
    print(f"\nmedian ms and TFLOPS per run, spread across runs ((max-min)/min of the medians) [{label}]", flush=True)
    print(format_table(table, args.runs))
    print()
    for line in summary_lines(by_mode):
        print(line, flush=True)
    print(f"# clocks at end: {report['clocks']['end']}; {report['seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
