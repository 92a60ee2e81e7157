"""program.md's keep-or-discard decision, per problem: `uv run python -m fa4tune.keep I1 I2 C1 [C2]`.

I1 and I2 are the incumbent's two results.tsv rows, C1 and C2 the change's runs (row numbers as `--list` prints
them, 1 for the first row; negative numbers count from the end). Each row keeps every problem's timed-call
quartiles (prepare.py writes them into its config JSON as "problems").

A problem's noise S is the largest of: the interquartile range of its timed calls in each row compared, in percent
of its median; the incumbent's run-to-run difference on it, 100 * |I1 - I2| / min(I1, I2); and NOISE_FLOOR_PCT,
the run-to-run drift of a median between separate runs that a run's own quartiles do not show. The change is
- *faster* on a problem when every candidate run's median is below the incumbent's faster run by more than S:
  max(C) < min(I) / (1 + S/100);
- *slower* on it when any candidate run's median is above the incumbent's slower run by more than S:
  max(C) > max(I) * (1 + S/100).

Keep when every candidate row passed the gate on every problem, the change is faster on at least one problem and
slower on none. With one candidate row the answer is whether run 2 is worth making.

Why per problem and not the suite's geomean: a change confined to one problem class moves the geomean by a
fraction of its gain, and the geomean's spread is the largest IQR of any problem (often a short decode's, 3-6 %
on the H200). A dispatch entry 5.5 % faster on its problem (IQR 0.2 %) moved the backward geomean 0.4 %, against
a 3.2 % spread: the geomean rule discarded it (docs/measurements/2026-12-01-h200-agent-loop.md).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from fa4tune.harness.results_tsv import ResultRow, read_rows

FASTER, SLOWER, SAME = "faster", "slower", "same"
# Separate runs of one config on the H200 (emulated) moved a problem's median by up to 1.4 % (68 problems x 2 runs,
# docs/measurements/2026-12-01-h200-table-vs-upstream.md); an unchanged problem drifted 0.56 % with an IQR of 0.45 %
# (docs/measurements/2026-12-01-h200-agent-loop.md), which a floor of zero called slower.
NOISE_FLOOR_PCT = 1.5


class KeepError(ValueError):
    """Rows that cannot be compared: a one-line reason naming the row."""


@dataclass(frozen=True)
class ProblemVerdict:
    """One problem across the rows compared."""

    key: str  # "fwd <label>"
    incumbent_ms: tuple[float, ...]
    candidate_ms: tuple[float, ...]
    noise_pct: float
    verdict: str  # FASTER | SLOWER | SAME

    @property
    def speedup(self) -> float:
        return min(self.incumbent_ms) / max(self.candidate_ms)


@dataclass(frozen=True)
class Decision:
    keep: bool
    reason: str
    problems: tuple[ProblemVerdict, ...]
    runs: int  # candidate rows compared


def _timings(row: ResultRow, number: int) -> dict:
    problems = row.config.get("problems")
    if not problems:
        raise KeepError(f"row {number} ({row.description!r}) has no per-problem timings (a results.tsv row from before "
                        f"prepare.py kept them): run that config again")
    return problems


def _gate_failures(row: ResultRow) -> str:
    done, _, total = row.configs_ok.partition("/")
    if row.status == "ok" and done == total:
        return ""
    return f"configs_ok {row.configs_ok}, status {row.status}"


def _iqr_pct(t: dict) -> float:
    if t.get("ms_q1") is None or t.get("ms_q3") is None or not t.get("ms_median"):
        return 0.0
    return 100.0 * (t["ms_q3"] - t["ms_q1"]) / t["ms_median"]


def decide(incumbent: list[ResultRow], candidate: list[ResultRow], numbers: list[int] | None = None) -> Decision:
    """The decision for 2 incumbent rows and 1 or 2 candidate rows (module docstring); KeepError for rows that
    cannot be compared."""
    if len(incumbent) != 2 or len(candidate) not in (1, 2):
        raise KeepError(f"needs the incumbent's 2 rows and 1 or 2 candidate rows, got {len(incumbent)} and {len(candidate)}")
    numbers = numbers or list(range(1, len(incumbent) + len(candidate) + 1))
    rows = incumbent + candidate
    timings = [_timings(row, n) for row, n in zip(rows, numbers)]
    for row, n in zip(incumbent, numbers):
        if failed := _gate_failures(row):
            raise KeepError(f"incumbent row {n} did not pass the gate everywhere ({failed}): it cannot be the incumbent")
    verdicts = []
    for key in timings[0]:
        if any(key not in t or t[key]["status"] != "ok" or not t[key].get("ms_median") for t in timings):
            continue  # a failed candidate problem ends the decision below; one the incumbent lacks is not compared
        inc = tuple(t[key]["ms_median"] for t in timings[:2])
        cand = tuple(t[key]["ms_median"] for t in timings[2:])
        noise = max([_iqr_pct(t[key]) for t in timings] + [100.0 * abs(inc[0] - inc[1]) / min(inc), NOISE_FLOOR_PCT])
        if max(cand) < min(inc) / (1 + noise / 100):
            verdict = FASTER
        elif max(cand) > max(inc) * (1 + noise / 100):
            verdict = SLOWER
        else:
            verdict = SAME
        verdicts.append(ProblemVerdict(key, inc, cand, noise, verdict))
    verdicts = tuple(verdicts)
    for row, n in zip(candidate, numbers[2:]):
        if failed := _gate_failures(row):
            return Decision(False, f"row {n} did not pass the gate everywhere ({failed})", verdicts, len(candidate))
    faster = [v for v in verdicts if v.verdict == FASTER]
    slower = [v for v in verdicts if v.verdict == SLOWER]
    if slower:
        names = ", ".join(f"{v.key} ({v.speedup:.3f}x, noise {v.noise_pct:.2f} %)" for v in slower)
        return Decision(False, f"slower beyond its noise on {len(slower)} problem(s): {names}", verdicts, len(candidate))
    if not faster:
        return Decision(False, "faster beyond its noise on no problem", verdicts, len(candidate))
    names = ", ".join(f"{v.key} ({v.speedup:.3f}x, noise {v.noise_pct:.2f} %)" for v in faster)
    return Decision(True, f"faster beyond its noise on {len(faster)} problem(s), slower on none: {names}", verdicts, len(candidate))


def _pick(rows: list[ResultRow], number: int) -> ResultRow:
    index = number - 1 if number > 0 else len(rows) + number
    if number == 0 or not 0 <= index < len(rows):
        raise KeepError(f"row {number}: results.tsv has rows 1 to {len(rows)} (or -1 to -{len(rows)} from the end)")
    return rows[index]


def _tflops(value: float | None) -> str:
    """A geomean TFLOPS column of `--list`: two decimals in a fixed width ('-' where the row has none)."""
    return f"{value:8.2f}" if value is not None else f"{'-':>8s}"


def _ms(values: tuple[float, ...]) -> str:
    return " / ".join(f"{v:.4f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fa4tune.keep", description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", type=int, help="I1 I2 C1 [C2]: results.tsv row numbers (negative: from the end)")
    parser.add_argument("--results", default="results.tsv")
    parser.add_argument("--list", action="store_true", help="print the rows with their numbers")
    args = parser.parse_args(argv)
    if not Path(args.results).is_file():
        print(f"error: no_results: {args.results} not found; run 'uv run python experiment.py > run.log' first", file=sys.stderr)
        return 2
    rows = read_rows(args.results).rows
    if args.list or not args.rows:
        for n, row in enumerate(rows, 1):
            print(f"{n:4d}  {row.timestamp}  {row.commit[:8]:8s}  fwd {_tflops(row.fwd_tflops_geomean)}  bwd {_tflops(row.bwd_tflops_geomean)}  "
                  f"{row.configs_ok}  {row.description}")
        return 0
    try:
        picked = [_pick(rows, n) for n in args.rows]
        decision = decide(picked[:2], picked[2:], [n if n > 0 else len(rows) + n + 1 for n in args.rows])
    except KeepError as err:
        print(f"error: keep: {err}", file=sys.stderr)
        return 2
    print(f"{'problem':44s} {'incumbent ms':>20s} {'candidate ms':>20s} {'noise %':>8s} {'speedup':>8s}  verdict")
    for v in decision.problems:
        print(f"{v.key:44s} {_ms(v.incumbent_ms):>20s} {_ms(v.candidate_ms):>20s} {v.noise_pct:8.2f} {v.speedup:8.3f}  {v.verdict}")
    if decision.runs == 1:
        print(f"run_2: {'yes' if decision.keep else 'no'} ({decision.reason})")
    else:
        print(f"keep: {'yes' if decision.keep else 'no'} ({decision.reason})")
    return 0 if decision.keep else 1


if __name__ == "__main__":
    sys.exit(main())
