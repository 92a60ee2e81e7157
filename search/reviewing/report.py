"""`python -m search report`: per study the trials, the best config against upstream's default, and credit per proposer."""

from __future__ import annotations

import optuna

from search.proposing.credit import credit
from search.storing import schema
from search.storing.history import best, confirmations, evaluated_count, records, short_config, winner


def report(storage, out) -> None:
    """Prints every search study of the storage."""
    summaries = [s for s in optuna.study.get_all_study_summaries(storage, include_best_trial=False) if schema.DIRECTION in s.user_attrs]
    if not summaries:
        print("no search studies in this storage", file=out)
    for summary in summaries:
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        print_study(summary.study_name, study.user_attrs, records(study), out)


def print_study(name: str, meta: dict, history, out) -> None:
    """One study: counts by status, best and winner, baseline, credit table."""
    search = [r for r in history if r.is_search]
    statuses: dict[str, int] = {}
    for r in search:
        label = "duplicate" if r.duplicate_of is not None else r.status
        statuses[label] = statuses.get(label, 0) + 1
    counts = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
    print(f"\n{name}: {len(search)} trials, {evaluated_count(history)} evaluated ({counts})", file=out)
    top = best(history)
    if top is None:
        print("  no config passed", file=out)
    else:
        baseline = next((r for r in search if r.proposer == "baseline" and r.ok), None)
        speedup = f", {top.value / baseline.value:.2f}x upstream's default ({baseline.value:.1f})" if baseline else ""
        print(f"  best   #{top.number} {top.value:.1f} TFLOPS by {top.proposer}{speedup}: {short_config(top.config)}", file=out)
        w = winner(history)
        if w is not None:
            confirmed = [c for c in confirmations(history, w.number) if c.confirmed]
            values = f" ({', '.join(f'{c.value:.1f}' for c in confirmed)})" if confirmed else ""
            if w.evaluator == "replay":  # a table's answer read again is no confirmation: say so where the count is
                print(f"  winner #{w.number} replayed from a table, not measured; its {len(confirmed)} confirmations "
                      f"read the table again{values}", file=out)
            else:
                print(f"  winner #{w.number} confirmed {len(confirmed)} times{values}", file=out)
    rejected = meta.get(schema.REJECTED_PROPOSALS) or {}
    print(f"  {'proposer':<12} {'trials':>6} {'evaluated':>9} {'infeasible':>10} {'rejected':>8} {'improvements':>12} {'best TFLOPS':>11}", file=out)
    for c in sorted(credit(history).values(), key=lambda c: -c.trials):
        best_text = f"{c.best:.1f}" if c.best is not None else "-"
        mark = "  <- holds the best" if c.holds_best else ""
        print(f"  {c.proposer:<12} {c.trials:>6} {c.evaluated:>9} {c.infeasible:>10} {rejected.get(c.proposer, 0):>8} {c.improvements:>12} {best_text:>11}{mark}", file=out)
    for proposer, n in rejected.items():
        if proposer not in {r.proposer for r in search}:
            print(f"  {proposer:<12} {0:>6} {0:>9} {0:>10} {n:>8} {0:>12} {'-':>11}", file=out)
