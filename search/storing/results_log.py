"""One results.tsv row per trial, in the format of the harness's fa4tune.harness.results_tsv (which appends it).

The row mirrors a harness run's: the geomean and peak of the trial's direction, the device and mode,
and in `config` the tuned config under "forward"/"backward" keyed by problem class, with the study and
trial that produced it.
"""

from __future__ import annotations

from datetime import datetime, timezone

from fa4tune.harness import metrics, results_tsv
from fa4tune.harness.measurement import Measurement
from search.storing.history import TrialRecord


def trial_row(spec, r: TrialRecord, m: Measurement | None, commit: str, harness_sha256: str, description: str) -> results_tsv.ResultRow:
    """The results.tsv row of one finished trial of a StudySpec (m: its measurement, None if not evaluated)."""
    direction, target = spec.direction, spec.target
    summary = metrics.summarize([m], target, m.device, m.mode) if m is not None else None
    geomean = r.value if r.ok else None
    peak = (summary.fwd_tflops_peak if direction == "fwd" else summary.bwd_tflops_peak) if summary else None
    what = f"search {spec.name} trial {r.number}" + (f" confirming #{r.confirmation_of}" if r.confirmation_of is not None else "")
    if r.duplicate_of is not None:
        what += f" (duplicate of #{r.duplicate_of}, not measured)"
    if r.reason:
        what += f": {r.reason}"
    return results_tsv.ResultRow(
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"), commit=commit, proposer=r.proposer,
        target=target.name, device=m.device if m else "", mode=m.mode if m else "static",
        fwd_tflops_geomean=geomean if direction == "fwd" else None, bwd_tflops_geomean=geomean if direction == "bwd" else None,
        fwd_tflops_peak=peak if direction == "fwd" else None, bwd_tflops_peak=peak if direction == "bwd" else None,
        peak_vram_mb=summary.peak_vram_mb if summary else None, configs_ok=f"{int(r.ok)}/1", status=r.status,
        prepare_sha256=harness_sha256, description=f"{description}; {what}" if description else what,
        config={"forward" if direction == "fwd" else "backward": {spec.problem_class.name: r.config}, "study": spec.name, "trial": r.number},
    )
