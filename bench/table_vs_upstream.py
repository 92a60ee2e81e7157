"""The shipped dispatch table (experiment.py) against upstream's SM120 defaults, per problem, in one GPU process.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/table_vs_upstream.py \\
        [--suites standard,generalization] [--runs 2] [--only SUBSTRING[,...]] [--direction bwd] [--fa2] [--out results.jsonl]

For every (problem, direction) of the suites: the table's configs (experiment.forward_config / backward_config of the
problem's class) and upstream's defaults (fa4tune.defaults: what upstream's interface runs on SM120), both through
experiment.attention, gated, then timed against each other in one step (fa4tune.harness.steps.measure_step: rounds
interleaved, L2 flushed, every round behind a blocking kernel). The whole list runs --runs times, the two
candidates' order swapped in alternate runs (run 1: table first; run 2: upstream first), so each problem has
`runs` interleaved medians per candidate. Every kernel is compiled ahead in CPU processes (search.evaluating.ahead).

Per problem: each candidate's medians, the speedup (upstream's mean median / the table's), and the spread, the
larger of the two candidates' run-to-run spreads, (max - min) / min of their medians. The rule the table is held
to: it loses on a problem when its speedup is below 1 / (1 + spread), i.e. slower by more than the measured noise.
Where the table's entry is upstream's own config (`same_config`: one kernel timed twice), the verdict is "same config":
the difference is the noise between two interleaved copies, never a loss.
Where upstream's configs fail the target's static rules (head dim 256: its tiles need more than SM120's 99 KB),
upstream is not timed, since only a GPU that emulates SM120 has the memory to run them: the verdict says
"upstream cannot run" with the rule, and the table's medians stand alone.
Each row records its class's entry (`entry`: own, "fallback <class>" for a neighbour's under fa4tune/fallback.py's
rule, upstream, wide); the summary gives the geomean per direction, regime and entry, and names each fallback class.
With --fa2, the backward steps of problems without GQA time a third candidate in the same step: torch SDPA on its
flash backend (FA2's mma.sync kernels, sdpa_kernel(FLASH_ATTENTION)), its gradients gated like the others; each such
row adds FA2's medians and the table's speedup over FA2 (issue 44: FA2 side by side).
Geomean speedups: forward over the prefill problems (chunked ones included), forward over the decodes, backward. One JSON line per step
result goes to --out as it is measured (a killed run keeps what it measured). On a GPU that is not SM 12.0 these
are the SM120 kernels emulated on it: the 99 KB rule is SM120's, the speed is the device's.
Emulation fidelity (bench/fidelity.py): each timed kernel's registers and spills compiled for sm_120a beside those of
its compile for the GPU's arch, both ahead in CPU processes; a row where a candidate's two compiles disagree (spill
traffic beyond fidelity.SPILL_MARGIN_BYTES, registers beyond fidelity.REGISTER_MARGIN) is flagged, left out of the
geomeans (and of by-entry geomeans and the lowest speedup), and named. `--fidelity-only [sm_90a]` compiles them on a
CPU machine and prints the table without timing; its sm_120a half lands in .cache/fidelity-facts.jsonl (carry it: the
GPU run then compiles only its own arch's).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import fidelity  # noqa: E402
from bench.common import compile_ahead, default_compile_jobs  # noqa: E402
from fa4tune import defaults, emulated_occupancy  # noqa: E402
from fa4tune.config import Problem  # noqa: E402
from fa4tune.suites import load_suite  # noqa: E402

TABLE, UPSTREAM, FA2 = "table", "upstream", "fa2"
NOT_RUN = "not run: the target's rules refuse it: "  # the reason of an upstream config an SM120 GPU cannot launch
COLUMNS = ("suite", "problem", "dir", "class", "table kernel", "upstream ms", "table ms", "speedup", "spread", "verdict")


@dataclasses.dataclass(frozen=True)
class Step:
    """One (problem, direction) and the two candidates' (forward, backward) configs."""

    suite: str
    problem: Problem
    direction: str
    table: tuple
    upstream: tuple
    upstream_refused: str = ""  # the target's rule that upstream's configs fail here (not timed: an emulating GPU would run them)
    entry: str = ""  # where the table's config of this direction comes from: "own", "fallback <class>", "upstream", "wide"


def plan(suites: list[str], experiment, only: str = "", directions: tuple = ("fwd", "bwd")) -> list[Step]:
    """Every (problem, direction) of the suites with the table's and upstream's configs of its class. Where upstream's
    configs fail the target's static rules (d256: its tiles need more than SM120's 99 KB), upstream is not timed: a
    GPU that emulates SM120 has the shared memory to run them, an SM120 GPU does not."""
    from fa4tune.harness.evaluation import feasibility_failure
    from fa4tune.targets import get_target

    target = get_target()
    steps = []
    for suite in suites:
        for p in load_suite(suite):
            if not any(part in p.label for part in only.split(",")):
                continue
            pc = p.problem_class
            table = (experiment.forward_config(pc), experiment.backward_config(pc))
            upstream = (defaults.upstream_forward(pc), defaults.upstream_backward(pc))
            for direction in [d for d in (("fwd", "bwd") if p.backward else ("fwd",)) if d in directions]:
                refused = feasibility_failure(direction, *upstream, p, target)
                steps.append(Step(suite, p, direction, table, upstream, f"{NOT_RUN}{target.name}: {refused}" if refused else "",
                                  entry_of(experiment, direction, pc)))
    return steps


def entry_of(experiment, direction: str, pc) -> str:
    """"own", "fallback <source class>", "upstream" or "wide": the dispatch tables' rule for the class (fa4tune/fallback.py);
    "" where experiment.py keeps no DispatchTables (`TABLES`)."""
    tables = getattr(experiment, "TABLES", None)
    if tables is None or not hasattr(tables, "resolution"):
        return ""
    found = tables.resolution(direction, pc)
    return f"fallback {found.source}" if found.is_fallback else found.rule


def compile_pairs(steps: list[Step]) -> list[tuple[str, object, Problem]]:
    """(kind, config, problem) for every kernel the steps run: each candidate's forward on every problem (a backward
    step runs its candidate's forward too) and its backward on the backward problems."""
    pairs = []
    for s in steps:
        for fwd, bwd in (s.table,) + (() if s.upstream_refused else (s.upstream,)):
            pairs.append(("fwd", fwd, s.problem) if s.direction == "fwd" else ("bwd", bwd, s.problem))
            if s.direction == "bwd":
                pairs.append(("fwd", fwd, s.problem))
    return pairs


def timed_kernels(step: Step) -> list[tuple[str, str, object]]:
    """(candidate, kind, config) of the kernels the step times: its direction's config of the table and of upstream
    (unless refused); a backward step times the gradients only, so its backward's kernel."""
    index = 0 if step.direction == "fwd" else 1
    named = [(TABLE, step.table)] + ([] if step.upstream_refused else [(UPSTREAM, step.upstream)])
    return [(name, step.direction, configs[index]) for name, configs in named]


def fidelity_facts(steps: list[Step], jobs: int, experiment_path, gpu_arch: str | None, gpu_env: dict | None) -> dict:
    """Both arches' registers and spills of every timed kernel (bench/fidelity.py: gather), compiled ahead in `jobs`
    CPU processes; without `gpu_arch`, sm_120a's alone (into the facts cache); {} with jobs 0."""
    if not jobs:
        return {}
    from fa4tune.targets import get_target

    pairs = [(kind, cfg, s.problem) for s in steps for _, kind, cfg in timed_kernels(s)]
    return fidelity.gather(fidelity.jobs_of(pairs), get_target(), experiment_path, jobs, gpu_arch, gpu_env,
                           log=lambda line: print(line, flush=True))


def fidelity_of(facts: dict, step: Step, kind: str, config) -> dict:
    """A record's "fidelity" (bench/fidelity.py: candidate_fidelity) from the gathered facts."""
    if not facts:
        return fidelity.candidate_fidelity(None)
    return fidelity.candidate_fidelity(facts.get(fidelity.facts_key(kind, config, step.problem.problem_class)), "no facts gathered for it")


def order(run: int) -> tuple[str, str]:
    """The candidates' order in a run: the table first in odd runs (1, 3, ...), upstream first in even ones."""
    return (TABLE, UPSTREAM) if run % 2 == 1 else (UPSTREAM, TABLE)


def read_runs(paths: list[str]) -> list[dict]:
    """The records of several runs' JSON lines files as one list: a later record of the same (suite, problem,
    direction, run, candidate) replaces the earlier one (a step re-run in a later call)."""
    from fa4tune.census import read_jsonl

    merged = {}
    for path in paths:
        for r in read_jsonl(Path(path)):
            merged[(r["suite"], r["problem"], r["direction"], r["run"], r["candidate"])] = r
    return list(merged.values())


def spread(values: list[float]) -> float:
    """(max - min) / min of a candidate's medians over the runs (0 with one run)."""
    return (max(values) - min(values)) / min(values) if len(values) > 1 else 0.0


def average(values: list[float]) -> float:
    return sum(values) / len(values)


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(records: list[dict]) -> dict:
    """Per (suite, problem, direction): medians per candidate over the runs, speedup, spread, verdict; geomeans.

    `records` are the JSON lines of the runs ({"suite", "problem", "direction", "regime", "class", "run",
    "candidate", "status", "ms_median", ...}). A problem where either candidate failed in any run has no speedup
    and the verdict names the failure."""
    rows: dict = {}
    for r in records:
        key = (r["suite"], r["problem"], r["direction"])
        row = rows.setdefault(key, {"suite": r["suite"], "problem": r["problem"], "direction": r["direction"],
                                    "regime": r["regime"], "class": r["class"], "table_kernel": r.get("table_kernel", ""),
                                    "entry": r.get("entry", ""),
                                    "ms": {TABLE: [], UPSTREAM: [], FA2: []}, "failures": [], "refused": "", "same_config": True,
                                    "fidelity": {}})
        row["same_config"] = row["same_config"] and bool(r.get("same_config"))
        if r.get("fidelity"):
            row["fidelity"].setdefault(r["candidate"], r["fidelity"])
        if r["status"] == "ok":
            row["ms"][r["candidate"]].append(r["ms_median"])
        elif r["candidate"] == UPSTREAM and r.get("reason", "").startswith(NOT_RUN):
            row["refused"] = r["reason"][len(NOT_RUN):]
        elif r["candidate"] == FA2:  # a reference beside the two: its failure is said, not the row's verdict
            row["fa2_failure"] = f"run {r['run']}: {r['status']}: {r.get('reason', '')[:120]}"
        else:
            row["failures"].append(f"{r['candidate']} run {r['run']}: {r['status']}: {r.get('reason', '')[:120]}")
    out = []
    for row in rows.values():
        table_ms, upstream_ms = row["ms"][TABLE], row["ms"][UPSTREAM]
        if row["refused"] and not row["failures"] and table_ms:
            row.update(speedup=None, spread=spread(table_ms), verdict=f"upstream cannot run: {row['refused']}")
        elif row["failures"] or not table_ms or not upstream_ms:
            row.update(speedup=None, spread=None, verdict="failed: " + "; ".join(row["failures"] or ["no measurement"]))
        else:
            speedup = (sum(upstream_ms) / len(upstream_ms)) / (sum(table_ms) / len(table_ms))
            noise = max(spread(table_ms), spread(upstream_ms))
            verdict = "loses" if speedup < 1 / (1 + noise) else ("wins" if speedup > 1 + noise else "within spread")
            if row["same_config"]:
                verdict = "same config"
            row.update(speedup=speedup, spread=noise, verdict=verdict)
        fa2_ms = row["ms"][FA2]
        row["over_fa2"] = (average(fa2_ms) / average(table_ms)) if fa2_ms and table_ms and not row["failures"] \
            and not row.get("fa2_failure") else None
        mark_fidelity(row)
        out.append(row)

    def speedups(direction, decode=None):
        return [r["speedup"] for r in out if r["direction"] == direction and r["speedup"] and not r["flag"]
                and decode in (None, r["regime"] == "decode")]

    ok = [r for r in out if r["speedup"] is not None and not r["flag"]]  # a flagged row's speedup is not SM120's
    by_entry: dict = {}  # (direction, regime group, own / fallback / ...) -> speedups: how the fallback rule serves
    for r in ok:
        group = "decode" if r["regime"] == "decode" else "prefill"
        by_entry.setdefault((r["direction"], group, r["entry"].split(" ")[0] or "?"), []).append(r["speedup"])
    return {
        "by_entry": {key: (len(v), geomean(v), min(v)) for key, v in sorted(by_entry.items())},
        "rows": out,
        "fwd_prefill_geomean": geomean(speedups("fwd", decode=False)),  # prefill and chunked prefill: every non-decode
        "fwd_decode_geomean": geomean(speedups("fwd", decode=True)),
        "bwd_geomean": geomean(speedups("bwd")),
        "min_speedup": min((r["speedup"] for r in ok), default=None),
        "over_fa2": {r["problem"]: r["over_fa2"] for r in out if r["over_fa2"] is not None},
        "losses": [f"{r['problem']} {r['direction']}" for r in out if r["verdict"] == "loses"],
        "failures": [f"{r['problem']} {r['direction']}" for r in out if r["verdict"].startswith("failed")],
        "upstream_cannot_run": [f"{r['problem']} {r['direction']}" for r in out if r["verdict"].startswith("upstream cannot run")],
        "fidelity_flagged": [f"{r['problem']} {r['direction']}" for r in out if r["flag"]],
        "fidelity_unchecked": [f"{r['problem']} {r['direction']}" for r in out if r["unchecked"]],
    }


def mark_fidelity(row: dict) -> None:
    """A summary row's emulation-fidelity flag (`flag`: '' or each flagged candidate's reason; such a row stays out of
    the geomeans) and `unchecked` (the candidates whose two compiles were not compared), from its records' fidelity."""
    row["flag"] = fidelity.row_flag(row["fidelity"])
    row["unchecked"] = fidelity.row_unchecked(row["fidelity"])


def takes_fa2(step: Step) -> bool:
    """--fa2 times SDPA's flash backend on a step: a backward step of a problem without GQA."""
    p = step.problem
    return step.direction == "bwd" and p.num_heads == p.num_heads_kv


def gpu_compile(jobs: int) -> tuple[str | None, dict | None]:
    """The GPU's compile arch and the compile pipeline's environment for it (the kernel cache's); (None, None) with jobs 0."""
    if not jobs:
        return None, None
    from fa4tune.harness import gpu
    from fa4tune.kernel_cache import device_arch
    from fa4tune.targets import get_target
    from search.evaluating.gpu_pipeline import DEFAULT_CACHE, compile_env

    info = gpu.read_device()
    return device_arch(*info.capability), compile_env(get_target(), info.capability, info.num_sms, DEFAULT_CACHE)


def cpu_compile_env(arch: str) -> dict:
    """The compile pipeline's environment for `arch` ('sm_90a') on a machine without that GPU (fake tensors), with
    the emulation's SM count (FLASH_ATTENTION_NUM_SMS, else the target's)."""
    import os

    from fa4tune.targets import get_target
    from search.evaluating.gpu_pipeline import DEFAULT_CACHE, compile_env

    digits = arch.removeprefix("sm_").rstrip("a")
    if not digits.isdigit() or len(digits) < 2:
        raise SystemExit(f"error: fidelity_arch: --fidelity-only takes an arch such as sm_90a, got {arch!r}")
    target = get_target()
    num_sms = int(os.environ.get("FLASH_ATTENTION_NUM_SMS") or target.num_sms)
    return compile_env(target, (int(digits[:-1]), int(digits[-1])), num_sms, DEFAULT_CACHE)


def kernel_rows(steps: list[Step], facts: dict) -> dict:
    """print_fidelity's summary of the steps' kernels without timing: one row per step, its candidates' fidelity."""
    rows = []
    for s in steps:
        row = {"problem": s.problem.label, "direction": s.direction,
               "fidelity": {name: fidelity_of(facts, s, kind, cfg) for name, kind, cfg in timed_kernels(s)}}
        mark_fidelity(row)
        rows.append(row)
    return {"rows": rows, "fidelity_flagged": [f"{r['problem']} {r['direction']}" for r in rows if r["flag"]],
            "fidelity_unchecked": [f"{r['problem']} {r['direction']}" for r in rows if r["unchecked"]]}


def fa2_candidate():
    """torch SDPA held to its flash backend (FA2's kernels; its backward is chosen with the forward)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    from fa4tune.harness.candidates import Candidate, sdpa_candidate

    sdpa = sdpa_candidate()

    def forward(q, k, v, causal, **packed):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            seqlen_q, seqlen_k = q.shape[1], k.shape[1]
            if not causal or seqlen_q == seqlen_k or packed:
                return sdpa.forward(q, k, v, causal, **packed)
            # the gate's causal cases with seqlen_q != seqlen_k: a materialized mask has no flash kernel ("No available
            # kernel"), SDPA's lower-right causal bias runs FA2's (bottom-right, as FlashAttention's causal)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 attn_mask=causal_lower_right(seqlen_q, seqlen_k))
            return out.transpose(1, 2), None

    return Candidate(FA2, forward, {"path": "torch SDPA, SDPBackend.FLASH_ATTENTION (FA2)"})


def kernel_name(cfg) -> str:
    tile = f"{cfg.tile_m}x{cfg.tile_n}" if hasattr(cfg, "tile_m") else f"{cfg.m_block_size}x{cfg.n_block_size}"
    return f"{getattr(cfg, 'kernel', 'sm120')} {tile} t{cfg.num_threads}"


def print_summary(summary: dict, label: str) -> None:
    widths = (15, 34, 4, 32, 24, 18, 18, 8, 7)
    print(f"\n== the table vs upstream's defaults, per problem [{label}] ==")
    print("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)) + "  " + COLUMNS[-1])
    for r in summary["rows"]:
        cells = (r["suite"], r["problem"], r["direction"], r["class"], r["table_kernel"],
                 " / ".join(f"{v:.4f}" for v in r["ms"][UPSTREAM]), " / ".join(f"{v:.4f}" for v in r["ms"][TABLE]),
                 f"{r['speedup']:.3f}" if r["speedup"] else "", f"{100 * r['spread']:.1f}%" if r["spread"] is not None else "")
        print("  ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + "  " + r["verdict"], flush=True)
    print_fidelity(summary)
    for name in ("fwd_prefill_geomean", "fwd_decode_geomean", "bwd_geomean", "min_speedup"):
        value = summary[name]
        print(f"{name}: {value:.3f}" if value else f"{name}: n/a")
    print(f"losses: {', '.join(summary['losses']) or 'none'}")
    print(f"failures: {', '.join(summary['failures']) or 'none'}")
    print(f"upstream cannot run (not timed): {', '.join(summary['upstream_cannot_run']) or 'none'}", flush=True)
    for (direction, group, entry), (n, mean, low) in summary["by_entry"].items():
        print(f"entry {direction} {group} {entry}: {n} problems, geomean {mean:.3f}, min {low:.3f}")
    for row in summary["rows"]:
        if row.get("fa2_failure"):
            print(f"fa2 {row['problem']} bwd: {row['fa2_failure']}")
    for problem, ratio in summary.get("over_fa2", {}).items():
        row = next(r for r in summary["rows"] if r["problem"] == problem and r["over_fa2"] is not None)
        against_upstream = f", FA2 {average(row['ms'][UPSTREAM]) / average(row['ms'][FA2]):.3f}x upstream" if row["ms"][UPSTREAM] else ""
        print(f"fa2 {problem} bwd: {' / '.join(f'{v:.4f}' for v in row['ms'][FA2])} ms, "
              f"the table {ratio:.3f}x FA2{against_upstream}")
    fallbacks = sorted({(r["class"], r["direction"], r["entry"]) for r in summary["rows"] if r["entry"].startswith("fallback")})
    for cls, direction, entry in fallbacks:
        print(f"fallback {direction} {cls}: runs {entry.split(' ', 1)[1]}'s entry", flush=True)


def print_fidelity(summary: dict) -> None:
    """Every row's registers and spill traffic per timed candidate, sm_120a's beside the GPU arch's compile, the
    flagged rows named with why, and how many (bench/fidelity.py)."""
    rows = summary["rows"]
    checked = [r for r in rows if any(f and (f.get("sm120a") or f.get("run")) for f in r["fidelity"].values())]
    print(f"\n== emulation fidelity: registers and spill traffic per timed kernel, sm_120a | the GPU's compile "
          f"(flagged beyond {fidelity.REGISTER_MARGIN} registers or {fidelity.SPILL_MARGIN_BYTES} B) ==")
    for r in rows:
        cells = []
        for name, f in r["fidelity"].items():
            if f and f.get("unchecked") == fidelity.NATIVE:
                cells.append(f"{name} {fidelity.describe(f['sm120a'])} (native)")
            elif f:
                cells.append(f"{name} {fidelity.describe(f.get('sm120a'))} | {fidelity.describe(f.get('run'))}")
        mark = "FLAGGED: " + r["flag"] if r["flag"] else ("unchecked: " + r["unchecked"] if r["unchecked"] else "agree")
        print(f"{r['problem']:34s} {r['direction']:3s}  {'; '.join(cells) or 'no facts'}  -> {mark}")
    flagged = summary.get("fidelity_flagged", [])
    print(f"fidelity_flagged: {len(flagged)} of {len(rows)} rows (left out of the geomeans and the lowest speedup): "
          f"{', '.join(flagged) or 'none'}")
    print(f"fidelity_unchecked: {len(summary.get('fidelity_unchecked', []))} rows ({len(checked)} with facts)", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default="standard,generalization", help="comma-separated suite names or paths")
    parser.add_argument("--runs", type=int, default=2, help="times the whole list is timed (order swapped each run)")
    parser.add_argument("--only", default="", help="only problems whose label contains this (or one of these, comma-separated)")
    parser.add_argument("--direction", choices=("fwd", "bwd"), help="only this direction's steps (default: both)")
    parser.add_argument("--out", default="table_vs_upstream.jsonl", help="JSON lines, one per (step, run, candidate)")
    parser.add_argument("--first-run", type=int, default=1,
                        help="number of the first run (its order: table first when odd): a run cut by a call's time limit "
                             "goes on in the next call as --runs 1 --first-run 2")
    parser.add_argument("--summarize", metavar="JSONL[,JSONL...]",
                        help="print the summary of finished runs' JSON lines (several files: one table, a later file's "
                             "record replacing an earlier one's for the same step, run and candidate) and exit")
    parser.add_argument("--compile-jobs", type=int, default=default_compile_jobs(),
                        help="CPU processes compiling every kernel ahead into the kernel cache (0: compile in the GPU process)")
    parser.add_argument("--fa2", action="store_true",
                        help="also time torch SDPA's flash backend (FA2) on the backward steps of problems without GQA")
    parser.add_argument("--fidelity-only", nargs="?", const="", metavar="ARCH",
                        help="no GPU: compile every kernel the run would time for sm_120a (into the facts cache: carry "
                             ".cache/fidelity-facts.jsonl to the GPU run) and, with ARCH (sm_90a: an H100/H200's), for ARCH "
                             "too; print the fidelity table and exit")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.first_run < 1:
        parser.error(f"--runs and --first-run must be at least 1, got {args.runs} and {args.first_run}")
    if args.summarize:
        print_summary(summarize(read_runs(args.summarize.split(","))), args.summarize)
        return 0

    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH, Settings, new_gate_seed

    suites = [s for s in args.suites.split(",") if s]
    settings = Settings(gate_seed=new_gate_seed())
    steps = plan(suites, load_experiment(EXPERIMENT_PATH), args.only, (args.direction,) if args.direction else ("fwd", "bwd"))
    if args.fidelity_only is not None:  # on the CPU: the compiles alone
        arch = args.fidelity_only or None
        facts = fidelity_facts(steps, max(1, args.compile_jobs), EXPERIMENT_PATH, arch, cpu_compile_env(arch) if arch else None)
        print_fidelity(kernel_rows(steps, facts))
        return 0
    facts = fidelity_facts(steps, args.compile_jobs, EXPERIMENT_PATH, *gpu_compile(args.compile_jobs))  # before the gate shapes'
    compile_ahead(compile_pairs(steps), settings, args.compile_jobs, name=kernel_name)

    import torch

    from fa4tune.harness import gpu
    from fa4tune.harness.candidates import experiment_candidate
    from fa4tune.harness.measurement import ProblemResult
    from fa4tune.harness.steps import StepContextLost, make_flusher, measure_step
    from fa4tune.targets import get_target

    experiment = load_experiment(EXPERIMENT_PATH)
    device = torch.device("cuda")
    info = gpu.read_device()
    mode = gpu.select_mode(info, get_target())
    how = f"emulated {emulated_occupancy.describe('SM120')}" if mode == "emulated" else "native"
    label = f"{info.name}, SM120 kernels {how}, gate seed {settings.gate_seed}"
    runs = range(args.first_run, args.first_run + args.runs)
    print(f"{len(steps)} steps x {args.runs} runs (run {runs[0]} to {runs[-1]}) [{label}]", flush=True)
    flusher = make_flusher(device)
    records = []
    with open(args.out, "a") as out:
        for run in runs:
            for s in steps:
                configs = {TABLE: s.table, UPSTREAM: s.upstream}
                timed = [name for name in order(run) if not (name == UPSTREAM and s.upstream_refused)]
                candidates = [experiment_candidate(experiment, *configs[name], name=name) for name in timed]
                if args.fa2 and takes_fa2(s):
                    timed.append(FA2)
                    candidates.append(fa2_candidate())
                try:
                    results = measure_step(s.problem, s.direction, candidates, device=device, settings=settings, flusher=flusher)
                except StepContextLost as lost:
                    print(f"error: device fault on {s.problem.label} {s.direction} run {run}: {lost.reason}", flush=True)
                    return 1
                if s.upstream_refused:
                    results[UPSTREAM] = ProblemResult(s.problem.label, s.direction, "infeasible", reason=s.upstream_refused)
                for name in order(run) + ((FA2,) if FA2 in results else ()):
                    res = results[name]
                    cfg, upstream_cfg = (configs[c][0 if s.direction == "fwd" else 1] for c in (TABLE, UPSTREAM))
                    record = {"suite": s.suite, "problem": s.problem.label, "direction": s.direction,
                              "regime": s.problem.problem_class.regime, "class": s.problem.problem_class.name,
                              "table_kernel": kernel_name(cfg), "same_config": cfg.key() == upstream_cfg.key(), "entry": s.entry,
                              "run": run, "candidate": name, "device": info.name,
                              "mode": mode, **res.to_dict()}
                    if name in configs:  # the SM120 kernels (not FA2's): their emulation fidelity
                        record["fidelity"] = fidelity_of(facts, s, s.direction, configs[name][0 if s.direction == "fwd" else 1])
                    records.append(record)
                    out.write(json.dumps(record) + "\n")
                    out.flush()
                r = {name: results[name] for name in (TABLE, UPSTREAM)}
                print(f"run {run} {s.problem.label} {s.direction}: " + ", ".join(
                    f"{n} {v.status} {v.ms_median:.4f} ms" if v.ms_median else f"{n} {v.status} {v.reason[:80]}" for n, v in r.items()), flush=True)
    print_summary(summarize(records), label)
    return 0


if __name__ == "__main__":
    sys.exit(main())
