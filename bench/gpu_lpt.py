"""The TMA forward with its tiles handed out longest first (kernels/tma_lpt_forward_sm120.py, "sm120_tma_lpt") on a GPU:
the gate over a correctness matrix, then each problem's dispatch-table entry against its TMA twin and its LPT twin.

    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 python3 bench/gpu_lpt.py [--part matrix|timing|both]
        [--configs 64x96x128:q,128x64x128] [--suites chunked,standard] [--only SUBSTRING] [--runs 2]

Part 1, matrix: each --configs entry (tile_m x tile_n x num_threads, `:q` for Q in registers, one stage) as
sm120_tma_lpt (`:cp`: as its cp.async sibling sm120_lpt, `:p`: as sm120_tma_paired, `:l2`: as sm120_lpt_l2, `:ih`: as
sm120_lpt_in_head, `:sp`: as sm120_tma_smpaired, `:t`: as sm120_tma_trimmed, `:dc`: as sm120_decode_cluster, which runs
the matrix's one-token d128 problems only, and six more one-token decodes for it: one_token_problems) over bench/gpu_overlap.py's matrix (the LSE gated too). A row
that is not ok fails the exit code.
Part 2, timing: per forward problem of --suites (decodes left out), the table's entry, its TMA twin (same tile,
threads and Q_in_regs, one stage), its LPT twin (the same on sm120_tma_lpt), its paired twin (the same on
sm120_tma_paired: kernels/tma_paired_forward_sm120.py), its smpaired twin (sm120_tma_smpaired), its trimmed twin
(the paired one with the masked blocks' PV gemms trimmed: sm120_tma_trimmed), where the entry is upstream's kernel its
cp.async LPT twins (sm120_lpt, sm120_lpt_l2 and sm120_lpt_in_head, the entry's stages) and upstream's SM120 defaults, gated, then
timed interleaved in one step, the whole list --runs times, the order reversed in alternate runs. Per problem: each
candidate's medians and its speedup over the TMA twin and over upstream; then the LPT twin's geomean over the TMA
twin, causal problems and others apart. On a GPU that is not SM 12.0 the SM120 kernels run emulated (label the figures).
"""

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa4tune.config import ForwardConfig  # noqa: E402

LPT, TMA, LPT_CP_ASYNC, PAIRED = "sm120_tma_lpt", "sm120_tma", "sm120_lpt", "sm120_tma_paired"
LPT_L2, LPT_IN_HEAD, SM_PAIRED = "sm120_lpt_l2", "sm120_lpt_in_head", "sm120_tma_smpaired"
TRIMMED = "sm120_tma_trimmed"
DECODE_CLUSTER = "sm120_decode_cluster"
DEFAULT_CONFIGS = "64x96x128:q,128x64x128"


def _overlap():
    """bench/gpu_overlap.py as a module (the twin benches' command line, matrix and timing loop)."""
    spec = importlib.util.spec_from_file_location("gpu_overlap", ROOT / "bench" / "gpu_overlap.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_configs(text: str) -> list[ForwardConfig]:
    """'64x96x128:q,...' as one-stage sm120_tma_lpt configs; the flag `cp` makes one the cp.async sibling sm120_lpt,
    `p` the paired order sm120_tma_paired, `l2` the cp.async sibling with L2-sized head sections sm120_lpt_l2, `ih`
    the cp.async sibling longest first within each head sm120_lpt_in_head, `sp` the tiles claimed by SM
    sm120_tma_smpaired, `t` the paired order with the masked blocks' PV gemms trimmed sm120_tma_trimmed, `dc` the
    one-kernel cluster decode sm120_decode_cluster (16x64x256)."""
    configs = []
    for item in filter(None, text.split(",")):
        tile, *flags = item.split(":")
        tile_m, tile_n, threads = (int(x) for x in tile.split("x"))
        kernel = {"cp": LPT_CP_ASYNC, "p": PAIRED, "l2": LPT_L2, "ih": LPT_IN_HEAD, "sp": SM_PAIRED,
                  "t": TRIMMED, "dc": DECODE_CLUSTER}.get(next(
            (f for f in flags if f != "q"), ""), LPT)
        configs.append(ForwardConfig(tile_m, tile_n, threads, 1, "q" in flags, kernel=kernel))
    return configs


def timing_candidates(experiment, problem, target, configs) -> list[tuple[str, ForwardConfig]]:
    """The entry, its TMA twin and its LPT twin (where the problem admits them), upstream's defaults (always)."""
    from fa4tune import defaults
    from fa4tune.feasibility import check_forward_problem

    entry = experiment.forward_config(problem.problem_class)
    twin = dataclasses.replace(entry, num_stages=1, extra={}, kernel=TMA)
    named = [("table", entry), ("tma twin", twin), ("lpt twin", dataclasses.replace(twin, kernel=LPT)),
             ("paired twin", dataclasses.replace(twin, kernel=PAIRED)),
             ("smpaired twin", dataclasses.replace(twin, kernel=SM_PAIRED)),
             ("trimmed twin", dataclasses.replace(twin, kernel=TRIMMED))]
    if entry.kernel in ("sm120", "sm120_splitkv"):  # upstream's kernel (the split-KV class's at one split is its code)
        named.append(("lpt cp twin", dataclasses.replace(entry, extra={}, kernel=LPT_CP_ASYNC)))
        named.append(("lpt l2 cp twin", dataclasses.replace(entry, extra={}, kernel=LPT_L2)))
        named.append(("lpt in-head cp twin", dataclasses.replace(entry, extra={}, kernel=LPT_IN_HEAD)))
    seen, out = set(), []
    for label, cfg in named:
        if cfg.key() not in seen and check_forward_problem(cfg, problem, target):
            seen.add(cfg.key())
            out.append((label, cfg))
    return out + [("upstream", defaults.upstream_forward(problem.problem_class))]


def run_timing(experiment, settings, problems, target, runs: int, candidates_of) -> None:
    """Part 2: per problem, the candidates gated and timed interleaved, `runs` times; medians and speedups."""
    from fa4tune.harness import gpu

    medians, names = _overlap().time_interleaved(experiment, settings, problems, runs, candidates_of,
                                                 label_width=10, name_width=44)
    print("\n| problem | candidate | config | ms (runs) | vs tma twin | vs upstream |\n|---|---|---|---|---|---|")
    gains: dict[bool, list[float]] = {True: [], False: []}
    for problem in problems:
        mean = {lab: sum(v) / len(v) for (p, lab), v in medians.items() if p == problem.label and len(v) == runs}
        twin = mean.get("tma twin", mean.get("table"))  # the entry is its own TMA twin when it is on sm120_tma
        for label in sorted(mean, key=lambda lab: mean[lab]):
            vs_twin = f"{twin / mean[label]:.3f}" if twin else ""
            vs_up = f"{mean['upstream'] / mean[label]:.3f}" if "upstream" in mean else ""
            ms = " / ".join(f"{v:.4f}" for v in medians[(problem.label, label)])
            print(f"| {problem.label} | {label} | {names[(problem.label, label)]} | {ms} | {vs_twin} | {vs_up} |")
        if twin and "lpt twin" in mean:
            gains[problem.causal].append(twin / mean["lpt twin"])
    for causal, values in gains.items():
        if values:
            g = math.exp(sum(math.log(v) for v in values) / len(values))
            print(f"geomean, the LPT twin over the TMA twin, {'causal' if causal else 'non-causal'}: {g:.3f} over {len(values)} problems")
    mode = gpu.select_mode(gpu.read_device(), target)
    print(f"mode: {mode} (SM120 kernels{' emulated on this device' if mode == 'emulated' else ''})")


def one_token_problems(configs) -> list:
    """With a `:dc` config, one-token decodes beside the matrix's three: keys fewer than the cluster's 8 CTAs (some CTAs
    get none), a partial last 16-key group, several 512-key tiles per CTA with a partial last one, GQA 1/4/8, batch 1
    and 2, causal and not (the same for one query token)."""
    from fa4tune.config import Problem

    if not any(c.kernel == DECODE_CLUSTER for c in configs):
        return []
    shapes = [(1, 1, 4), (2, 5, 8), (1, 100, 1), (2, 4097, 4), (1, 9000, 8), (2, 20000, 4)]  # batch, seqlen_k, GQA
    return [Problem(batch, 1, sk, 4 * gqa, 4, 128, 128, i % 2 == 1, backward=False,
                    name=f"b{batch} sq1 sk{sk} d128 gqa{gqa}{' causal' if i % 2 else ''}")
            for i, (batch, sk, gqa) in enumerate(shapes)]


def main(argv=None) -> int:
    return _overlap().twin_bench_main(argv, __doc__.splitlines()[0], "lpt", DEFAULT_CONFIGS,
                                      "tile_m x tile_n x threads[:q], comma-separated", parse_configs, timing_candidates,
                                      run_timing, extra_matrix=one_token_problems)


if __name__ == "__main__":
    sys.exit(main())
