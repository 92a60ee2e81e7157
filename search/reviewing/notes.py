"""Markdown notes for optuna-dashboard: one per study (what it tunes, where the numbers come from, upstream's
default) and one per finished trial (status with its reason, per-problem TFLOPS, static facts, proposer and
rationale).

The notes carry what the dashboard would otherwise hide: optuna-dashboard 0.21 does not display constraints
set with `trial.set_constraint`, so each trial's note says whether the config was feasible and which rule
rejected it. A note a person edited in the dashboard is kept: only notes that end with FOOTER are rewritten.

Only writing notes needs optuna-dashboard (its note layout); reading a replayed table's meta does not, so
`report --plots` and `export` work without the package.
"""

from __future__ import annotations

from fa4tune.targets import TARGETS
from search.reviewing.evidence import StudyEvidence, load_studies, mode_sentence, replayed_table
from search.storing import schema
from search.storing.history import TrialRecord, short_config

FOOTER = "_Written by fa4-tune from the trial's user attrs; a note edited by hand is left alone._"
STATUS_WORDS = {
    "ok": "passed the correctness gate and was timed",
    "infeasible": "infeasible: a static rule rejected it, it never ran",
    "incorrect": "incorrect: failed the correctness gate, never timed",
    "crash": "crash: the kernel or its process died",
    "timeout": "timeout: ran past the step's time limit",
    "compile_error": "compile error",
    "missing": "missing from the replayed table",
    "unsupported": "unsupported by the kernel",
    "guard": "stopped by a run-time guard",
}
STATIC_FIELDS = (
    ("registers", "registers"), ("stack_bytes", "stack B"), ("spill_store_bytes", "spill store B"),
    ("spill_load_bytes", "spill load B"), ("dynamic_smem_bytes", "dynamic smem B"), ("static_smem_bytes", "static smem B"),
    ("occupancy", "occupancy"), ("occupancy_limiter", "limited by"),
)


def study_note(ev: StudyEvidence, table_meta: dict | None = None) -> str:
    """The study's note: problem class, direction, target, device, mode, problems and upstream's default."""
    pc = ev.problem_class
    target = TARGETS.get(ev.target)
    device, mode = ev.source()
    default, failed = ev.default(), ev.default_failed()
    if default is not None:
        baseline = f"{default.value:.1f} TFLOPS geomean (trial #{default.number})"
    elif failed is not None:
        baseline = f"measured in trial #{failed.number}: {failed.status} ({failed.reason})"
    else:
        baseline = "not measured in this study"
    rows = [
        ("problem class", f"`{pc.name}`: head_dim {pc.head_dim}, head_dim_v {pc.head_dim_v}, "
                          f"{'causal' if pc.causal else 'non-causal'}, qhead_per_kvhead {pc.qhead_per_kvhead}, {pc.dtype}"),
        ("direction", {"fwd": "forward", "bwd": "backward"}.get(ev.direction, ev.direction)),
        ("target", f"`{ev.target}`" + (f": {target.description}; the static rules allow {target.smem_per_block} B of shared memory" if target else "")),
        ("device", device or "no trial evaluated yet"),
        ("mode", f"`{mode}`: {mode_sentence(device, mode, table_meta)}" if mode else "no trial evaluated yet"),
        ("problems", "; ".join(ev.problems)),
        ("objective", ev.meta.get(schema.OBJECTIVE, "")),
        ("upstream default", f"`{short_config(ev.default_config())}`: {baseline}"),
    ]
    w = ev.winner()
    if w is not None:
        speedup = f", {w.value / default.value:.2f}x upstream's default" if default is not None else ""
        confirmed = ev.confirmed(w.number)
        rows.append(("winner", f"trial #{w.number} by {w.proposer}: {w.value:.1f} TFLOPS{speedup}; "
                               f"confirmed {len(confirmed)} times" + (f" ({', '.join(f'{c.value:.1f}' for c in confirmed)})" if confirmed else "")
                               + f": `{short_config(w.config)}`"))
    search = ev.search_trials
    statuses: dict[str, int] = {}
    for r in search:
        label = "duplicate" if r.duplicate_of is not None else r.status
        statuses[label] = statuses.get(label, 0) + 1
    rows.append(("trials", f"{len(search)} search trials: " + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))))
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return (
        f"## {ev.name}\n\n| | |\n|---|---|\n{table}\n\n"
        "Feasibility: a config that breaks a static rule (or whose measurement failed) is told PRUNED without a value and with "
        "`trial.set_constraint(\"feasibility\", v)`, v > 0, so the history plot leaves it out. This dashboard does not show constraints: each trial's note starts with its status and the rule that "
        "rejected it (user attrs `status`, `rule`, `reason`, `constraint`).\n\n" + FOOTER + "\n"
    )


def trial_note(ev: StudyEvidence, r: TrialRecord) -> str:
    """A finished trial's note: status and reason first, then per-problem numbers, static facts, proposer."""
    a = ev.user_attrs(r.number)
    constraint = (a.get(schema.CONSTRAINT) or [None])[0]
    feasible = "**feasible: no**" if r.status == "infeasible" else "**feasible: yes**"
    # a replayed trial's numbers are a table's record: never say the harness gated or timed it in this run
    replayed = f"replayed from {replayed_table(a.get(schema.DEVICE, '')) or 'a recorded table'}, not measured by this run" \
        if r.evaluator == "replay" else ""
    if r.status == "infeasible":
        head = f"{feasible} · rule `{r.rule}`: {r.reason}"
    elif r.ok:
        head = f"{feasible} · **ok**: {r.value:.1f} TFLOPS geomean ({replayed or STATUS_WORDS['ok']})"
    else:
        head = f"{feasible} · **{r.status}**: {STATUS_WORDS.get(r.status, r.status)}" + (f" · {r.reason}" if r.reason else "")
        if replayed and r.status != "missing":
            head += f" ({replayed})"
    lines = [head]
    if constraint is not None:
        lines.append(f"\nconstraint `feasibility` = {constraint:g} (> 0: infeasible or failed)")
    lines.append(f"\nconfig: `{short_config(r.config)}`")
    if r.duplicate_of is not None:
        lines.append(f"\nduplicate of trial #{r.duplicate_of}: its numbers are copied, not measured again")
    if r.confirmation_of is not None:
        lines.append(f"\nconfirmation of trial #{r.confirmation_of}: {'confirmed' if r.confirmed else 'NOT confirmed'}")
    if r.results:
        lines.append("\n| problem | status | TFLOPS | max error (tolerance) |\n|---|---|---|---|")
        for p in r.results:
            tflops = f"{p.tflops:.1f}" if p.tflops is not None else "-"
            errors = p.max_errors or {}
            error = f"{errors['out']:.2g} ({errors['out_tolerance']:.2g})" if "out" in errors and "out_tolerance" in errors else \
                (f"{errors['out']:.2g}" if "out" in errors else "-")
            lines.append(f"| {p.problem} | {p.status} | {tflops} | {error} |")
    elif r.tflops:
        lines.append("\n| problem | TFLOPS |\n|---|---|")
        lines.extend(f"| {k} | {v:.1f} |" for k, v in r.tflops.items())
    known = [(label, r.static[key]) for key, label in STATIC_FIELDS if key in r.static]
    if known:
        lines.append("\nstatic facts (sm_120a cubin):\n\n| " + " | ".join(label for label, _ in known) + " |\n|"
                     + "---|" * len(known) + "\n| " + " | ".join(str(value) for _, value in known) + " |")
    lines.append(f"\nproposer: **{r.proposer or 'unknown'}**")
    if r.rationale:
        lines.append(f"\n> {r.rationale}")
    lines.append("\n" + FOOTER)
    return "\n".join(lines) + "\n"


TABLE_KEYS = ("name", "device", "mode", "target", "date", "command", "synthetic")


def table_meta(table) -> dict:
    """What a study note needs to know of a replayed table (search.evaluating.table.ReplayTable)."""
    return {"name": table.name, **{k: v for k, v in table.meta.items() if k in TABLE_KEYS}}


def remembered_table(storage, study_names: list[str]) -> dict | None:
    """The replayed table's meta that write_notes left on these studies, when they all agree on one."""
    metas = [storage.get_study_system_attrs(storage.get_study_id_from_name(name)).get(schema.REPLAYED_TABLE) for name in study_names]
    return metas[0] if metas and metas[0] and all(m == metas[0] for m in metas) else None


def write_notes(storage, trials: bool = True, table: dict | None = None) -> tuple[int, int]:
    """Writes every search study's note (and its finished trials' notes); (notes written, hand-edited notes kept).

    `table` (table_meta()) is remembered on the studies replayed from it, so that later notes say what the
    table's numbers are without being told again.
    """
    # optuna-dashboard's own storage layout for notes (0.21): versioned chunks in the study's system attrs.
    from optuna_dashboard._note import get_note_from_system_attrs

    written = kept = 0
    for ev in load_studies(storage):
        study_id = storage.get_study_id_from_name(ev.name)
        system = storage.get_study_system_attrs(study_id)
        if table and replayed_table(ev.source()[0]) == table["name"] and system.get(schema.REPLAYED_TABLE) != table:
            storage.set_study_system_attr(study_id, schema.REPLAYED_TABLE, table)
            system[schema.REPLAYED_TABLE] = table
        wanted = {None: study_note(ev, system.get(schema.REPLAYED_TABLE))}
        for trial, r in zip(ev.trials, ev.history):
            if trials and r.state in ("COMPLETE", "PRUNED", "FAIL"):
                wanted[trial._trial_id] = trial_note(ev, r)
        for trial_id, body in wanted.items():
            current = get_note_from_system_attrs(system, trial_id)
            if current["body"] == body:
                continue
            if current["body"] and not current["body"].rstrip().endswith(FOOTER):
                kept += 1
                continue
            _save(storage, study_id, trial_id, current["version"] + 1, body, system)
            written += 1
    return written, kept


def _save(storage, study_id: int, trial_id: int | None, version: int, body: str, system: dict) -> None:
    """optuna_dashboard's save_note_with_version, without re-reading every system attr for each note."""
    from optuna_dashboard._note import note_str_key_prefix, note_ver_key, split_body

    prefix = note_str_key_prefix(trial_id)
    chunks = split_body(body, trial_id)
    stale = {f"{prefix}{i}": "" for i in range(len(chunks), sum(1 for key in system if key.startswith(prefix)))}
    storage.set_study_system_attr(study_id, note_ver_key(trial_id), version)
    for key, value in {**chunks, **stale}.items():  # a shorter note: the old chunks past its end are emptied
        storage.set_study_system_attr(study_id, key, value)

