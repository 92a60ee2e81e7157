"""The main loops of forward kernels' SASS, compiled on the CPU (fake tensors): per loop its instructions, thread-index
reads and how far ahead each ldmatrix (LDSM) is issued of the first instruction that reads it; so a build without an
ldmatrix prefetch shows without a GPU (docs/measurements/2026-12-06-sm90-ldsm-schedule.md).

    uv run python bench/sass_loops.py --suite models --only "prefill 4k" [--arch sm_90a|sm_120a] [--twins]
        [--config dispatch|64x64x128:q:t]

Default arch sm_90a: the H100/H200 run the sm_90a build; a twin that is not prefetched there may lose by an artifact
(ptxas sometimes schedules that build's main loop with each LDSM ~1 instruction before the HMMA that reads it instead
of ~22, and such builds ran 20-25 % slower on the H100; the sm_120a builds, the real target, did not show it).
Per forward prefill problem of the suite (label containing --only): the table's entry (or --config, bench/common.py's
notations) and, with --twins, its twin on each TMA class (bench/gpu_twins.py's twins()), each compiled through
fa4tune.fake_compile.compile_shapes (no kernel cache); a markdown row each. Main loops: a backward branch whose body
holds >= 64 HMMA (the innermost such); the first is the masked loop, the last the unmasked one. `prefetched`: the
unmasked loop's median LDSM-to-use distance (instructions within the body) >= PREFETCH_MIN_DISTANCE.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa4tune.config import ConfigError  # noqa: E402

ARCHS = ("sm_90a", "sm_120a")
MIN_LOOP_HMMA = 64
# Median LDSM-to-use of the unmasked loop (the record): 1-1.5 instructions in the 4 unprefetched sm_90a builds (46-51 of
# 64 LDSMs within 8), 22-22.5 in the prefetched sm_90a builds, 16-16.5 in every sm_120a build. 8 sits well between.
PREFETCH_MIN_DISTANCE = 8
PREFETCHED = {True: "yes", False: "**no**", None: "?"}  # None: no main loop, or no LDSM in it
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_REG = re.compile(r"(?<![A-Z])R(\d+)")  # R12, not the uniform UR12


def parse_sass(text: str) -> list[tuple[int, str]]:
    """(address, instruction) per SASS line of `cuobjdump -sass`, operands' whitespace and scheduling hints dropped."""
    out = []
    for line in text.splitlines():
        m = _LINE.search(line)
        if m:
            ins = re.sub(r"\s+\?\S+$", "", re.sub(r"\s+&(wr|rd|req)=\S+", "", m.group(2).strip()))
            out.append((int(m.group(1), 16), re.sub(r"\s+", " ", ins)))
    return out


def opcode(ins: str) -> str:
    return ins.split()[1 if ins.startswith("@") else 0]


def main_loops(ins: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """The bodies (branch target .. backward branch) of loops with >= MIN_LOOP_HMMA HMMA, in branch order; a loop that
    encloses another such loop is left out. Only a predicated or uniform branch closes a loop (as the record's)."""
    spans = []
    for k, (addr, i) in enumerate(ins):
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", i)
        if not (m and int(m.group(1), 16) < addr and (i.startswith("@") or "BRA.U" in i)):
            continue
        target, j = int(m.group(1), 16), k
        while j > 0 and target < ins[j][0] and ins[j - 1][0] < ins[j][0]:  # back within this function
            j -= 1
        if ins[j][0] == target and sum("HMMA" in x for _, x in ins[j:k + 1]) >= MIN_LOOP_HMMA:
            spans.append((j, k))
    inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    return [ins[j:k + 1] for j, k in inner]


def _operands(ins: str) -> str:
    return ins.split(None, 2 if ins.startswith("@") else 1)[-1]


def _ldsm_dest(ins: str) -> set[str]:
    base = int(_REG.search(_operands(ins)).group(1))
    width = opcode(ins).rsplit(".", 1)[-1]
    return {f"R{base + k}" for k in range(int(width) if width in ("1", "2", "4") else 2)}


def _reads(ins: str, regs: set[str]) -> bool:
    """Whether `ins` reads any of `regs` (its sources: the operands after the destination; an HMMA's A operand spans 4
    registers, B and C 2, as the record's ldsm_dist.py counts them)."""
    sources = ",".join(_operands(ins).split(",")[1:])
    found = {f"R{r}" for r in _REG.findall(sources)}
    if opcode(ins).startswith("HMMA"):
        for n, r in enumerate(_REG.findall(sources)[:3]):
            found |= {f"R{int(r) + k}" for k in range(4 if n == 0 else 2)}
    return bool(found & regs)


def ldsm_distances(body: list[tuple[int, str]]) -> list[int]:
    """Per LDSM of a loop body: instructions until the first one in the body that reads its destination (an LDSM
    with no reader before the branch, one for the next iteration's top, is left out, as the record's ldsm_dist.py)."""
    out = []
    for k, (_, i) in enumerate(body):
        if opcode(i).startswith("LDSM"):
            regs = _ldsm_dest(i)
            out += [next((j - k for j in range(k + 1, len(body)) if _reads(body[j][1], regs)), None)]
    return [d for d in out if d is not None]


def _tid_reads(ins: list[tuple[int, str]]) -> int:
    return sum(bool(re.search(r"S2R.*SR_TID", i)) for _, i in ins)


def loop_facts(body: list[tuple[int, str]]) -> dict:
    """A loop body's instructions, HMMA, S2R SR_TID reads, LDSM, and the LDSM-to-use median and min (None: none)."""
    d = ldsm_distances(body)
    return dict(instructions=len(body), hmma=sum("HMMA" in i for _, i in body), s2r_tid=_tid_reads(body),
                ldsm=sum(opcode(i).startswith("LDSM") for _, i in body), ldsm_median=statistics.median(d) if d else None, ldsm_min=min(d) if d else None)


def summary(sass: str, facts=None, sm: int | None = None) -> dict:
    """One cubin's SASS: instructions, S2R SR_TID reads, its main loops' facts, `prefetched` (None: no loop or no
    LDSM in it); registers and spills from `facts` (fa4tune.cubin.CubinFacts) when given."""
    ins = parse_sass(sass)
    loops = [loop_facts(b) for b in main_loops(ins)]
    median = loops[-1]["ldsm_median"] if loops else None
    return dict(sm=sm, instructions=len(ins), s2r_tid=_tid_reads(ins), loops=loops,
                **{k: getattr(facts, k, None) for k in ("registers", "spill_store_bytes", "spill_load_bytes")},
                prefetched=None if median is None else median >= PREFETCH_MIN_DISTANCE)


def cubin_summary(cubin: bytes) -> dict:
    """summary() of a cubin's SASS (cuobjdump from fa4tune.cubin.tool_path), its registers and spills (read_cubin)."""
    from fa4tune.cubin import cubin_sm, read_cubin, tool_path

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([str(tool_path("cuobjdump")), "-sass", f.name], capture_output=True, text=True, check=True,
                              timeout=120).stdout
    return summary(sass, read_cubin(cubin), cubin_sm(cubin))


def row(problem: str, label: str, name: str, s: dict) -> str:
    loops = s["loops"]
    med = loops[-1]["ldsm_median"] if loops else None
    return (f"| {problem} | {label} | {name} | {s['registers']} | {s['spill_store_bytes']} / {s['spill_load_bytes']} | "
            f"{' / '.join(str(lp['instructions']) for lp in (loops[0], loops[-1])) if loops else '-'} | "
            f"{'-' if med is None else f'{med:g}'} | {PREFETCHED[s['prefetched']]} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="models")
    parser.add_argument("--only", default="", help="only problems whose label contains this")
    parser.add_argument("--arch", default="sm_90a", help="sm_90a (default: what the H100/H200 emulation runs) or sm_120a")
    parser.add_argument("--twins", action="store_true", help="also each TMA class's twin of the entry")
    parser.add_argument("--config", default="dispatch", help="'dispatch' (the table's entry) or a config (bench/common.py)")
    args = parser.parse_args(argv)
    if args.arch not in ARCHS:
        raise ConfigError("arch", f"--arch is one of {', '.join(ARCHS)}, got {args.arch!r}")
    if "cutlass" in sys.modules and os.environ.get("CUTE_DSL_ARCH") != args.arch:  # the DSL fixes its arch on import
        return subprocess.run([sys.executable, __file__, *(sys.argv[1:] if argv is None else argv)]).returncode
    dump = Path(tempfile.mkdtemp(prefix="sass-loops-"))
    os.environ.update(FLASH_ATTENTION_ARCH="sm_120", CUTE_DSL_ARCH=args.arch, FLASH_ATTENTION_NUM_SMS="132",
                      CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=str(dump), PYTHONWARNINGS="ignore")
    os.environ.pop("FA4TUNE_KERNEL_CACHE", None)
    warnings.filterwarnings("ignore")
    from bench.common import config_name, resolve_config
    from bench.gpu_twins import twins
    from fa4tune import fake_compile
    from fa4tune.feasibility import check_forward_problem
    from fa4tune.harness.candidates import load_experiment
    from fa4tune.harness.settings import EXPERIMENT_PATH
    from fa4tune.suites import load_suite
    from fa4tune.targets import get_target

    problems = [p for p in load_suite(args.suite)
                if args.only in p.label and not p.backward and p.problem_class.regime == "prefill"]
    if not problems:
        raise ConfigError("only", f"no forward prefill problem of suite {args.suite!r} has {args.only!r} in its label")
    experiment, target = load_experiment(EXPERIMENT_PATH), get_target()
    try:
        entries = [(problem, resolve_config(args.config, problem.problem_class, experiment)) for problem in problems]
    except ValueError as err:
        raise ConfigError("config", f"--config {args.config!r}: {err}") from None
    fake_compile._clear_dumps = lambda: None  # the cubins are read from the dump below
    print(f"arch {args.arch}; prefetched: the unmasked loop's median LDSM-to-use >= {PREFETCH_MIN_DISTANCE}\n", flush=True)
    print("| problem | candidate | kernel/config | registers | spills st / ld B | loop instructions masked / unmasked "
          "| LDSM to use, median (unmasked) | prefetched |\n|---|---|---|---|---|---|---|---|", flush=True)
    for problem, entry in entries:
        seen = set()
        for label, cfg in twins(entry) if args.twins else [("table" if args.config == "dispatch" else "config", entry)]:
            if cfg.key() in seen or not check_forward_problem(cfg, problem, target):
                continue
            seen.add(cfg.key())
            for path in dump.glob("*"):
                path.unlink()
            try:
                fake_compile.compile_shapes(experiment, "fwd", cfg, [problem], read_facts=False)
                found = [cubin_summary(p.read_bytes()) for p in sorted(dump.glob("*.cubin"))]
                s = max(found, key=lambda x: sum(lp["hmma"] for lp in x["loops"]))  # a combine kernel beside: the main one
            except Exception as err:
                print(f"| {problem.label} | {label} | {config_name(cfg)} | compile error: {fake_compile.error_reason(err)} | | | | |",
                      flush=True)
                continue
            if s["sm"] != int(args.arch[3:-1]):
                raise RuntimeError(f"the cubin is for sm_{s['sm']}, not {args.arch}: the DSL was imported before CUTE_DSL_ARCH")
            print(row(problem.label, label, config_name(cfg), s), flush=True)
    shutil.rmtree(dump, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as err:  # bad input: one line naming the rule and the value
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
