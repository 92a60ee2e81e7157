"""The shipped table (experiment.py) against every peer, gated and timed side by side in one interleaved step per
problem: upstream's defaults, upstream's autotuner (its own candidates and our feasible space handed to it), pull
request #2634 (its dispatch, unpacked GQA, its decode kernel), #2771's backward configs through our backward
classes, and torch SDPA (FA2 on its flash backend).

    python3 bench/peer_sources.py check      # .peers/ as bench/peers_manifest.json names it (refused otherwise)
    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/peers.py \\
        [--suites standard,generalization,models,decode] [--direction fwd] [--part 1/3] [--only TEXT] [--runs 1] \\
        [--peers upstream,autotune_own,...] [--out peers.jsonl]
    python3 bench/peers.py --summarize peers.jsonl

Per (problem, direction) of the suites (bench/table_vs_upstream.plan: the table's and upstream's configs of its
class), one fa4tune.harness.steps.measure_step runs every candidate that applies: each gated (fp32 reference, five
input cases), then timed against the others (rounds interleaved in shuffled order, L2 flushed, behind a blocking
kernel, every timed output checked). A peer that does not apply gets a `not_run` record with the reason: the autotuner
on a soft-cap or fp8 problem or on a backward, #2634's decode kernel off its one-token GQA decodes, a #2771 config
our classes cannot express ("cannot express: <what>", with our rule), SDPA on a soft-cap. Forward steps first tune
upstream's autotuner on the problem's own call (its wall time recorded; bench/peer_candidates.tune), then time the
config it picked. Every kernel is compiled ahead in CPU processes: ours into the kernel cache, the peers' into
flash-attn's persistent cache. `--runs 2` times the list twice, the table's and upstream's order swapped.

The summary: per peer and regime (forward prefill, chunked included; forward decode; backward), the geomean of the
table's speedup over the peer (the peer's mean median / the table's), on how many problems the table is at least as
fast, and every problem where the table runs below 0.98x of a peer. On a GPU that is not SM 12.0 every SM120 kernel
(ours and the peers') runs emulated, padded to SM120's CTAs per SM; SDPA's FA2 runs natively, not held to 99 KB.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import peer_candidates as peers_run  # noqa: E402
from bench import peer_configs, peer_sources  # noqa: E402
from bench.common import compile_ahead, default_compile_jobs  # noqa: E402
from bench.peer_candidates import (  # noqa: E402
    AUTOTUNE_OURS, AUTOTUNE_OWN, PR2634, PR2634_DECODE, PR2634_UNPACKED, PR2771,
)
from bench.table_vs_upstream import TABLE, UPSTREAM, Step, compile_pairs, kernel_name, order  # noqa: E402
from bench.table_vs_upstream import plan as table_plan  # noqa: E402

SDPA = "sdpa"  # the SDPA peer: `fa2` on its flash backend, `sdpa_<backend>` where flash cannot take the problem
PEERS = (UPSTREAM, AUTOTUNE_OWN, AUTOTUNE_OURS, PR2634, PR2634_UNPACKED, PR2634_DECODE, PR2771, SDPA)
BELOW = 0.98  # a problem where the table runs below this fraction of a peer's speed is listed
NOT_RUN = "not_run"
GROUPS = ("prefill", "decode", "bwd")


@dataclasses.dataclass(frozen=True)
class PeerStep:
    """A step of table_vs_upstream's plan with what each peer runs there: `not_run` {peer: why}, the autotuner's
    candidate lists, #2771's config through our classes, #2634's variants."""

    step: Step
    not_run: dict
    autotune: dict  # {AUTOTUNE_OWN: [FwdConfig], AUTOTUNE_OURS: [FwdConfig]}; `handover` says what ours lost
    handover: dict  # reason -> count of our feasible configs the autotuner's format cannot take
    pr2771: object  # peer_configs.Expressed on a backward step, else None
    pr2634: tuple  # the #2634 variants timed


def plan(suites: list[str], experiment, config_module, target, num_sms: int, only: str = "", directions=("fwd", "bwd"),
         peers=PEERS) -> list[PeerStep]:
    """Every step of the suites with each peer's part in it (what it runs, or why not)."""
    from fa4tune.space import feasible_forward

    feasible: dict = {}
    out = []
    for s in table_plan(suites, experiment, only, directions):
        p, not_run = s.problem, {}
        lists, handover, expressed, variants = {}, {}, None, []
        if UPSTREAM in peers and s.upstream_refused:
            not_run[UPSTREAM] = s.upstream_refused
        for name in (AUTOTUNE_OWN, AUTOTUNE_OURS):
            if name not in peers:
                continue
            why = "forward only" if s.direction == "bwd" else peer_configs.autotune_refusal(p)
            if not why:
                if name == AUTOTUNE_OWN:
                    lists[name] = peer_configs.autotune_own(config_module, p, num_sms, target)
                else:
                    pc = p.problem_class
                    feasible.setdefault(pc, feasible_forward(pc, target))
                    lists[name], handover = peer_configs.autotune_handover(config_module, p, num_sms, feasible[pc])
                why = "" if lists[name] else "no candidate: none of its SM120 tiles fits the target's rules"
            if why:
                lists.pop(name, None)
                not_run[name] = why
        for variant in (PR2634, PR2634_UNPACKED, PR2634_DECODE):
            if variant in peers:
                why = peers_run.pr2634_eligible(p, s.direction, variant)
                not_run.update({variant: why} if why else {})
                variants += [] if why else [variant]
        if PR2771 in peers:
            if s.direction == "fwd":
                not_run[PR2771] = "backward only"
            else:
                expressed = peer_configs.express_pr2771(peer_configs.pr2771_backward(p, num_sms), p, target)
                if expressed.config is None:
                    not_run[PR2771] = expressed.label
        if SDPA in peers and p.softcap:
            not_run[SDPA] = "torch SDPA has no soft-cap"
        out.append(PeerStep(s, not_run, lists, handover, expressed, tuple(variants)))
    return out


def take_part(steps: list, spec: str) -> list:
    """The i-th of n near-equal consecutive parts of the steps ('2/3'); all with ''."""
    if not spec:
        return steps
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise SystemExit(f"error: part: --part takes I/N (e.g. 2/3), got {spec!r}")
    if not 1 <= i <= n:
        raise SystemExit(f"error: part: --part {spec}: I must be between 1 and N")
    size = -(-len(steps) // n)
    return steps[(i - 1) * size:i * size]


def compile_pairs_of(steps: list[PeerStep]) -> list:
    """Our kernels the steps run (table_vs_upstream's, and #2771's configs through our classes, with the table's
    forward, which makes their graph)."""
    pairs = compile_pairs([ps.step for ps in steps])
    for ps in steps:
        if ps.pr2771 is not None and ps.pr2771.config is not None:
            pairs.append(("bwd", ps.pr2771.config, ps.step.problem))
    return pairs


def peer_jobs(steps: list[PeerStep], shapes_of) -> list[dict]:
    """The peers' compile_job requests: each autotuner candidate (and its default config, the reference it checks
    against) once per problem class, on its first problem; #2634's variants per step on its gate shapes
    (`shapes_of(problem)`: its dispatch picks tiles by sequence length)."""
    jobs, seen = [], set()
    for ps in steps:
        p = ps.step.problem
        for config in [c for configs in ps.autotune.values() for c in configs] + ([None] if ps.autotune else []):
            key = (repr(config), p.problem_class)
            if key not in seen:
                seen.add(key)
                jobs.append(peers_run.autotune_job(config, [p]))
        for variant in ps.pr2634:
            jobs.append(peers_run.pr2634_job(variant, ps.step.direction, shapes_of(p)))
    return jobs


def records_of(ps: PeerStep, run: int, results: dict, details: dict, device: str, mode: str) -> list[dict]:
    """One JSON record per candidate of the step (timed or not run), in the order the table prints them."""
    s, p = ps.step, ps.step.problem
    base = {"suite": s.suite, "problem": p.label, "direction": s.direction, "regime": p.problem_class.regime,
            "class": p.problem_class.name, "table_kernel": kernel_name(s.table[0 if s.direction == "fwd" else 1]),
            "entry": s.entry, "run": run, "device": device, "mode": mode}
    out = []
    for name, res in results.items():
        out.append({**base, "candidate": name, **res.to_dict(), "detail": details.get(name, "")})
    for name, why in ps.not_run.items():
        out.append({**base, "candidate": name, "status": NOT_RUN, "reason": why, "ms_median": None, "detail": ""})
    return out


# ---- the summary ----

def group_of(record: dict) -> str:
    """'bwd', 'decode' or 'prefill' (chunked prefills are prefills)."""
    return "bwd" if record["direction"] == "bwd" else ("decode" if record["regime"] == "decode" else "prefill")


def average(values):
    return sum(values) / len(values)


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(records: list[dict]) -> dict:
    """Rows per (suite, problem, direction): every candidate's medians, status and detail; per (peer, group): the
    table's speedups over the peer (the peer's mean median / the table's), their geomean, how many are >= 1, and the
    problems below BELOW. A candidate that failed in any run has no speedup; its failure is listed."""
    rows: dict = {}
    for r in records:
        key = (r["suite"], r["problem"], r["direction"])
        row = rows.setdefault(key, {"suite": r["suite"], "problem": r["problem"], "direction": r["direction"],
                                    "group": group_of(r), "class": r["class"], "ms": {}, "failed": {}, "not_run": {},
                                    "detail": {}})
        name = r["candidate"]
        if r["status"] == NOT_RUN:
            row["not_run"][name] = r.get("reason", "")
        elif r["status"] == "ok" and r.get("ms_median"):
            row["ms"].setdefault(name, []).append(r["ms_median"])
        else:
            row["failed"][name] = f"run {r['run']}: {r['status']}: {(r.get('reason') or '')[:160]}"
        if r.get("detail"):
            row["detail"][name] = r["detail"]
    peers: dict = {}
    for row in rows.values():
        table_ok = TABLE in row["ms"] and TABLE not in row["failed"]
        row["speedup"] = {}
        for name, ms in row["ms"].items():
            if name != TABLE and table_ok and name not in row["failed"]:
                row["speedup"][name] = average(ms) / average(row["ms"][TABLE])
                peers.setdefault((name, row["group"]), []).append((row, row["speedup"][name]))
    groups = {}
    for (name, group), pairs in sorted(peers.items()):
        speedups = [v for _, v in pairs]
        groups[(name, group)] = {
            "problems": len(pairs), "geomean": geomean(speedups), "at_least": sum(v >= 1.0 for v in speedups),
            "below": [(f"{row['problem']} {row['direction']}", v) for row, v in pairs if v < BELOW],
        }
    failures = [(f"{row['problem']} {row['direction']}", name, why) for row in rows.values() for name, why in row["failed"].items()]
    below = [(f"{row['problem']} {row['direction']}", name, v) for row in rows.values() for name, v in row["speedup"].items()
             if v < BELOW]
    return {"rows": list(rows.values()), "groups": groups, "failures": failures, "below": below}


def print_summary(summary: dict, label: str) -> None:
    print(f"\n== the table against every peer, per problem [{label}] ==")
    print("(speedup: the peer's median / the table's; > 1: the table is faster)")
    for row in summary["rows"]:
        table = " / ".join(f"{v:.4f}" for v in row["ms"].get(TABLE, [])) or row["failed"].get(TABLE, "no measurement")
        cells = [f"{name} {v:.3f}x" for name, v in row["speedup"].items()]
        cells += [f"{name} failed" for name in row["failed"] if name != TABLE]
        print(f"{row['suite']:15s} {row['problem'][:36]:36s} {row['direction']}  table {table} ms | " + " | ".join(cells), flush=True)
    print("\n== peers: what each ran, or why not ==")
    for row in summary["rows"]:
        for name, text in list(row["detail"].items()) + [(n, f"not run: {w}") for n, w in row["not_run"].items()]:
            print(f"  {row['problem'][:36]:36s} {row['direction']} {name}: {text}")
    print("\n== the table against each peer ==")
    for (name, group), g in summary["groups"].items():
        below = ", ".join(f"{problem} {v:.3f}x" for problem, v in g["below"]) or "none"
        print(f"{name} {group}: geomean {g['geomean']:.3f}x over {g['problems']} problems; the table >= {name} on "
              f"{g['at_least']}/{g['problems']}; below {BELOW}x: {below}")
    print(f"\nbelow {BELOW}x of a peer: " + ("; ".join(f"{problem} vs {name} {v:.3f}x" for problem, name, v in summary["below"])
                                             or "none"))
    print("failures: " + ("; ".join(f"{problem} {name}: {why}" for problem, name, why in summary["failures"]) or "none"), flush=True)


# ---- the run ----

def step_candidates(ps: PeerStep, run: int, experiment, picks: dict, sdpa_backends: dict, interface,
                    chosen: tuple = PEERS) -> tuple[list, dict]:
    """The step's candidates, in order (the table and upstream as table_vs_upstream alternates them, then the peers),
    and {name: detail} for the records. Two autotuner picks of one config are timed once (complete_results)."""
    from fa4tune.harness.candidates import experiment_candidate

    s, details, candidates = ps.step, {}, []
    for name in order(run):
        if name == TABLE or (name == UPSTREAM and UPSTREAM in chosen and UPSTREAM not in ps.not_run):
            candidates.append(experiment_candidate(experiment, *(s.table if name == TABLE else s.upstream), name=name))
    timed = {}  # autotuner candidate name -> its pick
    for name, pick in picks.items():
        twin = next((other for other, config in timed.items() if config == pick["picked"]), None)
        details[name] = (f"picked {peer_configs.describe(pick['picked'])} of {pick['candidates']} in {pick['seconds']:.1f} s "
                         f"({pick['how']})" + (f"; the same pick as {twin}: timed once" if twin else ""))
        if name == AUTOTUNE_OURS and ps.handover:
            details[name] += "; not handed over: " + ", ".join(f"{n} {why}" for why, n in ps.handover.items())
        if twin is None:
            timed[name] = pick["picked"]
            candidates.append(peers_run.autotune_candidate(name, pick["picked"]))
    for variant in ps.pr2634:
        candidates.append(peers_run.pr2634_candidate(variant, interface))
    if ps.pr2771 is not None and ps.pr2771.config is not None:
        details[PR2771] = f"{ps.pr2771.config.short()}: {ps.pr2771.label}"
        candidates.append(experiment_candidate(experiment, s.table[0], ps.pr2771.config, name=PR2771))
    key = (s.problem.label, s.direction)
    if key in sdpa_backends:
        backend, why = sdpa_backends[key]
        candidates.append(peers_run.sdpa_candidate(backend))
        details[peers_run.sdpa_name(backend)] = f"torch SDPA on its {backend} backend" + (f" (flash refused: {why})" if why else "")
    return candidates, details


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default="standard,generalization,models,decode", help="comma-separated suite names or paths")
    parser.add_argument("--direction", choices=("fwd", "bwd"), help="only this direction's steps (default: both)")
    parser.add_argument("--only", default="", help="only problems whose label contains this (or one of these, comma-separated)")
    parser.add_argument("--part", default="", help="I/N: only the I-th of N consecutive parts of the steps (a GPU call each)")
    parser.add_argument("--runs", type=int, default=1, help="times the whole list is timed (table/upstream order swapped each run)")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}")
    parser.add_argument("--out", default="peers.jsonl", help="JSON lines, one per (step, run, candidate)")
    parser.add_argument("--summarize", metavar="JSONL", help="print the summary of a finished run's JSON lines and exit")
    parser.add_argument("--resume", action="store_true",
                        help="leave out the steps --out holds a table record of (a call cut off by its time limit, run again)")
    parser.add_argument("--compile-jobs", type=int, default=default_compile_jobs(),
                        help="CPU processes compiling every kernel ahead (0: compile in the GPU process)")
    args = parser.parse_args(argv)
    if args.summarize:
        from fa4tune.census import read_jsonl

        print_summary(summarize(read_jsonl(Path(args.summarize))), args.summarize)
        return 0
    chosen = tuple(p for p in args.peers.split(",") if p)
    if unknown := [p for p in chosen if p not in PEERS]:
        parser.error(f"unknown peer {unknown[0]!r} (peers: {', '.join(PEERS)})")
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    try:
        peer_sources.require()  # before anything is compiled or timed: the peers' code as the manifest names it
    except peer_sources.PeersMissing as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return run(args, chosen)


def run(args, chosen: tuple) -> int:
    """The GPU part of main: plan, compile ahead, then per step the autotuner's tuning and one measure_step."""
    if args.compile_jobs:
        from search.evaluating.ahead import use_kernel_cache

        use_kernel_cache()  # before flash-attn is imported: its persistent cache then holds the peers' kernels too
    from fa4tune import emulated_occupancy
    from fa4tune.harness import gpu
    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH, Settings, new_gate_seed
    from fa4tune.targets import get_target

    target = get_target()
    emulated_occupancy.install(target.smem_per_sm)  # every kernel built here, the peers' too, at SM120's CTAs per SM
    from flash_attn.cute import config as config_module

    info = gpu.read_device()
    num_sms = int(os.environ.get("FLASH_ATTENTION_NUM_SMS") or info.num_sms)
    settings = Settings(gate_seed=new_gate_seed())
    experiment = load_experiment(EXPERIMENT_PATH)
    steps = take_part(plan([s for s in args.suites.split(",") if s], experiment, config_module, target, num_sms, args.only,
                           (args.direction,) if args.direction else ("fwd", "bwd"), chosen), args.part)
    if args.resume:
        steps = left_to_run(steps, Path(args.out), args.runs)
    compile_ahead(compile_pairs_of(steps), settings, args.compile_jobs, name=kernel_name)
    interface = peers_run.load_pr2634() if any(ps.pr2634 for ps in steps) else None
    ahead, keys = precompile_peers(steps, settings, args.compile_jobs, info, target)
    if interface is not None:
        interface._fa4tune_recorder.kernels.update(keys)  # what the compile processes built, by compile key

    import torch

    from fa4tune.harness.steps import StepContextLost, make_flusher, measure_step

    device = torch.device("cuda")
    mode = gpu.select_mode(info, target)
    how = f"emulated {emulated_occupancy.describe('SM120')}" if mode == "emulated" else "native"
    label = f"{info.name}, SM120 kernels {how}, gate seed {settings.gate_seed}"
    print(f"{len(steps)} steps x {args.runs} runs, peers {', '.join(chosen)} [{label}]", flush=True)
    flusher, records, picks, backends = make_flusher(device), [], {}, {}
    with open(args.out, "a") as out:
        for run_index in range(1, args.runs + 1):
            for ps in steps:
                s = ps.step
                key = (s.problem.label, s.direction)
                if SDPA in chosen and SDPA not in ps.not_run and key not in backends:
                    backends[key] = peers_run.sdpa_backend(s.problem, s.direction, device)
                for name, configs in ps.autotune.items():
                    if (key, name) not in picks:
                        try:
                            picks[(key, name)] = peers_run.tune(s.problem, configs, device, settings.gate_seed + 7)
                        except Exception as err:  # its failure is its row's
                            picks[(key, name)] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"}
                step_picks = {name: picks[(key, name)] for name in ps.autotune if "error" not in picks[(key, name)]}
                tuning_failed = {name: picks[(key, name)]["error"] for name in ps.autotune if "error" in picks[(key, name)]}
                candidates, details = step_candidates(ps, run_index, experiment, step_picks, backends, interface, chosen)
                if interface is not None:
                    interface._fa4tune_recorder.take()
                try:
                    results = measure_step(s.problem, s.direction, candidates, device=device, settings=settings, flusher=flusher)
                except StepContextLost as lost:
                    print(f"error: device fault on {s.problem.label} {s.direction} run {run_index}: {lost.reason}", flush=True)
                    return 1
                results = complete_results(ps, results, step_picks, tuning_failed)
                details.update(kernels_of(ps, interface, ahead))
                step_records = records_of(ps, run_index, results, details, info.name, mode)
                for record in step_records:
                    out.write(json.dumps(record) + "\n")
                out.flush()
                records += step_records
                print(f"run {run_index} {s.problem.label} {s.direction}: " + ", ".join(
                    f"{n} {r.status} {r.ms_median:.4f} ms" if r.ms_median else f"{n} {r.status}" for n, r in results.items()), flush=True)
    print_summary(summarize(records), label)
    return 0


def left_to_run(steps: list[PeerStep], out: Path, runs: int) -> list[PeerStep]:
    """The steps whose table record `out` does not hold for every run yet (a killed call's steps, measured, stay)."""
    from fa4tune.census import read_jsonl

    done: dict = {}
    for r in read_jsonl(out):
        if r.get("candidate") == TABLE:
            done.setdefault((r["suite"], r["problem"], r["direction"]), set()).add(r["run"])
    left = [ps for ps in steps if len(done.get((ps.step.suite, ps.step.problem.label, ps.step.direction), ())) < runs]
    print(f"resume: {len(steps) - len(left)} of {len(steps)} steps already in {out}", flush=True)
    return left


def complete_results(ps: PeerStep, results: dict, step_picks: dict, tuning_failed: dict) -> dict:
    """The step's results with the candidates timed once for two names (the autotuner's two lists picking the same
    config) under both, a failed tuning as its candidate's failure, and upstream's refusal as its own status."""
    from fa4tune.harness.measurement import ProblemResult

    p, direction = ps.step.problem, ps.step.direction
    for name, pick in step_picks.items():
        if name not in results:
            twin = next(other for other in step_picks if other in results and step_picks[other]["picked"] == pick["picked"])
            results[name] = results[twin]
    for name, why in tuning_failed.items():
        results[name] = ProblemResult(p.label, direction, "crash", reason=f"autotune: {why}")
    return results


def kernels_of(ps: PeerStep, interface, ahead: dict) -> dict:
    """{variant: the #2634 forward kernel its first call of the step ran} (the gate's first case: the problem itself),
    by the kernel recorder's map of compile keys, this process's builds and the compile processes' merged."""
    used = interface._fa4tune_recorder.take() if interface is not None else []
    out = {}
    for variant in ps.pr2634:
        here = [kernel for name, kernel in used if name == variant]
        found = here[:1] or ahead.get((variant, ps.step.direction, ps.step.problem.label), [])[:1]
        out[variant] = f"its forward kernel: {found[0] if found else 'loaded'}"
    return out


def precompile_peers(steps: list[PeerStep], settings, jobs: int, info, target) -> tuple[dict, dict]:
    """The peers' kernels compiled ahead in `jobs` CPU processes: ({(variant, direction, problem label): the kernel of
    the problem's call}, {compile key repr: #2634 kernel built})."""
    if not jobs:
        return {}, {}
    import time

    from fa4tune.config import Problem
    from search.evaluating.gpu_pipeline import DEFAULT_CACHE, compile_env
    from search.evaluating.pipeline import CompilePool
    from search.evaluating.precompile import gate_shapes

    requests = peer_jobs(steps, lambda p: gate_shapes([p], settings.gate_seed, settings.gate_random_problems))
    if not requests:
        return {}, {}
    start = time.perf_counter()
    pool = CompilePool("bench.peer_candidates:compile_job", jobs, env=compile_env(target, info.capability, info.num_sms, DEFAULT_CACHE),
                       sys_path=[str(peer_sources.ROOT)])
    try:
        replies = [f.result() for f in [pool.submit(job) for job in requests]]
    finally:
        pool.close()
    print(f"peers: precompiled {len(requests)} jobs in {time.perf_counter() - start:.0f} s with {jobs} processes", flush=True)
    kernels, keys = {}, {}
    for job, reply in zip(requests, replies):
        if reply["status"] != "ok":
            print(f"  {job['kind']} {job.get('variant', '')} {job['shapes'][0]['name']}: {reply['status']}: {reply.get('reason', '')[:300]}")
        if job["kind"] == "pr2634":
            kernels[(job["variant"], job["direction"], Problem.from_dict(job["shapes"][0]).label)] = reply.get("kernels", [])
            keys.update({key: kernel for key, kernel in reply.get("keys", {}).items() if kernel not in ("?", "loaded")})
    return kernels, keys


if __name__ == "__main__":
    sys.exit(main())
