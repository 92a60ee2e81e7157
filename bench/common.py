"""What the bench scripts share: the config notations of their command lines, the correctness matrix, the table
rows they print, compiling ahead, the gate over the matrix and the interleaved timing of a problem's candidates.

A script runs as a file (`python3 bench/NAME.py`): its first lines put the repository root on sys.path, then it
imports `from bench.common import ...`. Everything that needs torch or a GPU imports it inside the function, so
this module (and the scripts' pure parts) import on a CPU machine.

Config notations (one config per comma-separated item):

- split: `TMxTNxTHxST[q]:SPLITS` (tile_m x tile_n x num_threads x num_stages, `q` after the stages for Q in
  registers, `:SPLITS` the num_splits knob, 0 for the heuristic), a config of the split-KV class
  (parse_split_configs: '32x64x64x1q:4');
- tma: `TMxTNxTH[:q][:sN][:CLASS]` (one stage unless `sN`), CLASS one of TMA_CLASSES' flags: `tma` (the default,
  sm120_tma), `lpt` (sm120_tma_lpt), `p` (sm120_tma_paired), `t` (sm120_tma_trimmed) (parse_tma_configs:
  '64x96x128:q:lpt').

parse_config takes either (the tile's four or three numbers tell them apart); resolve_config also "dispatch" and
"upstream".
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from pathlib import Path

from fa4tune.config import ForwardConfig, Problem

ROOT = Path(__file__).resolve().parent.parent

SPLIT_KV = "sm120_splitkv"
TMA_CLASSES = {"tma": "sm120_tma", "lpt": "sm120_tma_lpt", "p": "sm120_tma_paired", "t": "sm120_tma_trimmed"}

# The correctness matrix (issue #13's, extended to prefills): seqlen_q x head_dim x GQA, seqlen_k never a tile multiple
MATRIX_SEQLEN_Q = (1, 2, 8, 64, 512)
MATRIX_HEAD_DIMS = (64, 96, 128)
MATRIX_GQA = (1, 4, 8)
PREFILL_SEQLENS = (1000, 3000)

COLUMNS = ("problem", "candidate", "status", "TFLOPS", "ms", "% HBM bound", "max errors (error/tolerance)")


class DebugLines:
    """The "fa4tune" logger's debug lines while it is open (which config ran each call, and why)."""

    def __enter__(self) -> list[str]:
        import logging

        self.lines: list[str] = []
        self.handler = logging.Handler(logging.DEBUG)
        self.handler.emit = lambda record: self.lines.append(record.getMessage())
        logging.getLogger("fa4tune").addHandler(self.handler)
        return self.lines

    def __exit__(self, *exc):
        import logging

        logging.getLogger("fa4tune").removeHandler(self.handler)


def default_compile_jobs() -> int:
    """CPU processes compiling ahead: every core but one (the GPU process's)."""
    return max(1, (os.cpu_count() or 2) - 1)


# ---- config notations ----

def parse_split_configs(text: str, kernel: str = SPLIT_KV) -> list[ForwardConfig]:
    """'16x64x32x1:0,...' (tile_m x tile_n x num_threads x num_stages : num_splits; a `q` after the stages puts Q in
    registers: '32x64x64x1q:0') as configs of `kernel`."""
    configs = []
    for item in filter(None, text.split(",")):
        tile, splits = item.split(":")
        Q_in_regs = tile.endswith("q")
        tile_m, tile_n, threads, stages = (int(x) for x in tile.removesuffix("q").split("x"))
        configs.append(ForwardConfig(tile_m, tile_n, threads, stages, Q_in_regs, kernel=kernel, extra={"num_splits": int(splits)}))
    return configs


def parse_tma_configs(text: str) -> list[ForwardConfig]:
    """'64x96x128:q:lpt,128x64x128:t' (tile_m x tile_n x num_threads, `:q` for Q in registers, `:sN` for N stages,
    one flag of TMA_CLASSES for the class, sm120_tma without one) as configs of the TMA classes."""
    configs = []
    for item in filter(None, text.split(",")):
        tile, *flags = item.split(":")
        tile_m, tile_n, threads = (int(x) for x in tile.split("x"))
        stages = next((int(f[1:]) for f in flags if f[:1] == "s" and f[1:].isdigit()), 1)
        classes = [f for f in flags if f != "q" and not (f[:1] == "s" and f[1:].isdigit())]
        unknown = [f for f in classes if f not in TMA_CLASSES]
        if unknown or len(classes) > 1:
            raise ValueError(f"{item!r}: flags are q, sN and one class of {', '.join(TMA_CLASSES)}")
        kernel = TMA_CLASSES[classes[0] if classes else "tma"]
        configs.append(ForwardConfig(tile_m, tile_n, threads, stages, "q" in flags, kernel=kernel))
    return configs


def parse_config(spec: str) -> ForwardConfig:
    """One config in either notation: four numbers in the tile ('32x64x64x2:0') are the split notation, three
    ('64x96x128:q:lpt') the tma notation."""
    tile = spec.split(":")[0].removesuffix("q")
    return (parse_split_configs if tile.count("x") == 3 else parse_tma_configs)(spec)[0]


def resolve_config(spec: str, problem_class, experiment) -> ForwardConfig:
    """A command line's config for one problem class: "dispatch" (the dispatch table's: experiment.forward_config),
    "upstream" (upstream's SM120 defaults: fa4tune.defaults.upstream_forward), or one in either notation."""
    from fa4tune import defaults

    if spec == "dispatch":
        return experiment.forward_config(problem_class)
    if spec == "upstream":
        return defaults.upstream_forward(problem_class)
    return parse_config(spec)


def config_name(cfg: ForwardConfig) -> str:
    """'sm120_splitkv 32x64 t64 s1 Q_in_regs splits=4': the kernel class, tile, threads, stages and extra knobs."""
    extra = "".join(f" splits={v or 'auto'}" if k == "num_splits" else f" {k}={v}" for k, v in cfg.extra_knobs.items())
    return f"{cfg.kernel} {cfg.tile_m}x{cfg.tile_n} t{cfg.num_threads} s{cfg.num_stages}{' Q_in_regs' if cfg.Q_in_regs else ''}{extra}"


# ---- the correctness matrix ----

def matrix_problems() -> list[Problem]:
    """Issue #13's correctness matrix: every (seqlen_q, head_dim, GQA), causal (bottom-right) and batch 1 / 8
    alternating so that every value of each axis meets both causal settings, seqlen_k never a multiple of 16."""
    problems = []
    for i, (sq, hd, gqa) in enumerate(itertools.product(MATRIX_SEQLEN_Q, MATRIX_HEAD_DIMS, MATRIX_GQA)):
        causal, batch = i % 2 == 1, 8 if (i // 2) % 2 else 1
        sk = max(1000, sq + 300) + 37 * (i % 5)  # never a multiple of 16: the last KV block is always partial
        kv_heads = 2 if batch == 8 else 4
        problems.append(Problem(batch, sq, sk, kv_heads * gqa, kv_heads, hd, hd, causal, backward=False,
                                name=f"b{batch} sq{sq} sk{sk} d{hd} gqa{gqa}{' causal' if causal else ''}"))
    return problems


def prefill_problems() -> list[Problem]:
    """Square prefills of odd lengths, every head dim, GQA 1 and 4, causal and not; one non-causal sq > sk."""
    problems = []
    for sq, hd, gqa, causal in itertools.product(PREFILL_SEQLENS, MATRIX_HEAD_DIMS, (1, 4), (False, True)):
        batch = 2 if sq < 2000 else 1
        problems.append(Problem(batch, sq, sq, 4 * gqa, 4, hd, hd, causal, backward=False,
                                name=f"b{batch} s{sq} d{hd} gqa{gqa}{' causal' if causal else ''}"))
    problems.append(Problem(2, 777, 333, 8, 8, 128, 128, False, backward=False, name="b2 sq777 sk333 d128"))
    return problems


# ---- rows ----

def format_errors(max_errors: dict) -> str:
    """'out 1.0e-02/1.6e-02 lse 3.1e-06/1.0e-05' from a ProblemResult's max_errors."""
    parts = []
    for name, value in max_errors.items():
        if not name.endswith("_tolerance"):
            tol = max_errors.get(f"{name}_tolerance")
            parts.append(f"{name} {value:.1e}" + (f"/{tol:.1e}" if tol is not None else ""))
    return " ".join(parts)


def print_row(row, widths=(34, 44, 12, 8, 9, 12)) -> None:
    print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)) + "  " + str(row[-1]), flush=True)


def result_row(label: str, name: str, result, bound_ms: float | None) -> tuple:
    """A COLUMNS row for one ProblemResult; the share of `bound_ms` (a floor) when given."""
    status = result.status if result.status == "ok" else f"{result.status}: {result.reason[:100]}"
    share = f"{100 * bound_ms / result.ms_median:.0f}%" if bound_ms and result.ms_median else ""
    return (label, name, status, f"{result.tflops:.2f}" if result.tflops else "",
            f"{result.ms_median:.4f}" if result.ms_median else "", share, format_errors(result.max_errors))


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def mode_line(target) -> str:
    """'mode: emulated (SM120 kernels emulated on this device)': how this device runs the target's kernels."""
    from fa4tune.harness import gpu

    mode = gpu.select_mode(gpu.read_device(), target)
    return f"mode: {mode} (SM120 kernels{' emulated on this device' if mode == 'emulated' else ''})"


# ---- compiling, gating, timing ----

def compile_ahead(pairs, settings, jobs: int, name=config_name) -> None:
    """Every ("fwd"|"bwd", config, problem) pair compiled in `jobs` CPU processes into the kernel cache, which this
    process then loads from (search.evaluating.ahead). jobs 0: nothing ahead, each kernel compiles where it runs."""
    if not jobs:
        return
    from search.evaluating.ahead import group_jobs, precompile, use_kernel_cache

    use_kernel_cache()
    precompile(group_jobs(pairs), settings, jobs, name=name, log=lambda line: print(line, flush=True))


def gate_matrix(configs, experiment, settings, matrix, target=None) -> int:
    """The harness's gate (one timed round) of each config over the matrix problems, a COLUMNS row per (problem,
    config); the number of rows that are not ok. With a `target`, problems the static rules refuse for a config
    are left out for it; without one, every problem runs (a refusal is a failing row)."""
    from fa4tune.feasibility import check_forward_problem
    from fa4tune.harness import evaluation

    gate_settings = dataclasses.replace(settings, rounds=1, warmup=1)
    failures = rows = 0
    print(f"\n== correctness matrix: {len(configs)} configs x {len(matrix)} problems (gate) ==")
    print_row(COLUMNS)
    for cfg in configs:
        problems = [p for p in matrix if target is None or check_forward_problem(cfg, p, target)]
        m = evaluation.evaluate("fwd", cfg, problems, experiment, settings=gate_settings)
        for problem, result in zip(problems, m.results):
            rows += 1
            failures += result.status != "ok"
            print_row(result_row(problem.label, config_name(cfg), result, None))
    print(f"matrix: {rows} rows, {failures} failing")
    return failures


def time_interleaved(experiment, settings, problems, runs: int, candidates_of, label_width: int = 13,
                     name_width: int = 44) -> tuple[dict, dict]:
    """Per problem, the candidates `candidates_of(problem)` ((label, config) pairs) gated and timed in one step
    (fa4tune.harness.steps.measure_step), `runs` times, the order reversed on odd runs; returns the ok medians by
    (problem label, candidate label) and the config names by the same key."""
    import torch

    from fa4tune.harness.candidates import experiment_candidate
    from fa4tune.harness.steps import make_flusher, measure_step

    device = torch.device("cuda")
    flusher = make_flusher(device)
    medians: dict[tuple[str, str], list[float]] = {}
    names: dict[tuple[str, str], str] = {}
    for run in range(runs):
        for problem in problems:
            named = candidates_of(problem)
            if run % 2:
                named.reverse()
            bwd = experiment.backward_config(problem.problem_class)
            candidates = [experiment_candidate(experiment, cfg, bwd, name=label) for label, cfg in named]
            results = measure_step(problem, "fwd", candidates, device=device, settings=settings, flusher=flusher)
            for label, cfg in named:
                r = results[label]
                names[(problem.label, label)] = config_name(cfg)
                status = r.status if r.status == "ok" else f"{r.status}: {r.reason[:120]}"
                print(f"run {run + 1}  {problem.label:34s} {label:{label_width}s} {config_name(cfg):{name_width}s} {status:8s} "
                      f"{r.tflops or 0:7.1f} TFLOPS {r.ms_median or 0:.4f} ms", flush=True)
                if r.status == "ok":
                    medians.setdefault((problem.label, label), []).append(r.ms_median)
    return medians, names


def gpu_script_main(steps: dict, names: list[str], debug: bool = True, echo_calls: bool = True) -> int:
    """A GPU script's main: a bad step name is one line and exit 2; then fa4tune's debug lines (which config ran each
    call, and why) on for the whole run where `debug` (a script that times with them off turns them on around its
    gated calls itself), printed to stdout where `echo_calls`; the shipped tables in use (the guards' shared entry
    point); the steps in order (run_steps)."""
    import logging
    import sys

    if not names or any(name not in steps for name in names):
        print(f"error: steps: one or more of {', '.join(steps)}", file=sys.stderr)
        return 2
    logger = logging.getLogger("fa4tune")
    if debug:
        logger.setLevel(logging.DEBUG)
    if echo_calls:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    from fa4tune.harness.candidates import load_default_experiment
    from fa4tune.torch_op import use_tables

    use_tables(load_default_experiment().TABLES)
    return run_steps(steps, names)


def run_steps(steps: dict, names: list[str]) -> int:
    """Each named step of a GPU script in order, between "== name" and "name: ok" (or "N failed") lines; exit status
    1 where any failed."""
    failures = 0
    for name in names:
        print(f"== {name}", flush=True)
        failed = steps[name]()
        print(f"{name}: {'ok' if not failed else f'{failed} failed'}", flush=True)
        failures += failed
    return 1 if failures else 0
