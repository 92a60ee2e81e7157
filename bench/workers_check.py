"""What several workers left in one storage: trials by state, configs measured twice, trials lost, and per worker.

    python3 bench/workers_check.py --storage sqlite:///search.db [--json out.json]

For every study of the storage: trials per state; search trials that reached an evaluator, and how many distinct
configs they were (a config measured twice outside a confirmation is a duplicate measurement); failed trials and
whether each was requeued and finished (complete or pruned) by another trial (a failed trial not requeued, or
requeued and not finished, is lost); trials still RUNNING or WAITING (lost unless a worker is still alive);
evaluated trials per worker. Exit 1 when a study has a duplicate measurement or a lost trial.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def check_study(study) -> dict:
    """The counts above for one study."""
    from optuna.trial import TrialState

    from search.storing import schema
    from search.storing.history import config_key, evaluated_count, records

    trials = study.get_trials(deepcopy=False)
    history = records(study)
    measured = [config_key(r.config) for r in history if r.is_search and r.evaluated]
    requeued = {t.user_attrs.get(schema.REQUEUED_FROM): t for t in trials if t.user_attrs.get(schema.REQUEUED_FROM) is not None}
    failed = [t for t in trials if t.state == TrialState.FAIL]
    finished = (TrialState.COMPLETE, TrialState.PRUNED)  # pruned: measured, stopped early (search.storing.history.FINISHED)
    lost = [t.number for t in failed if t.number not in requeued or requeued[t.number].state not in finished]
    unfinished = [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    return {
        "study": study.study_name,
        "states": dict(Counter(t.state.name for t in trials)),
        "evaluated": evaluated_count(history),
        "measured_search_trials": len(measured),
        "distinct_configs": len(set(measured)),
        "duplicate_measurements": len(measured) - len(set(measured)),
        "failed": [t.number for t in failed],
        "requeued": {str(n): requeued[n].number for n in (t.number for t in failed) if n in requeued},
        "lost": lost,
        "unfinished": unfinished,
        "per_worker": dict(Counter(t.user_attrs.get(schema.WORKER, "?") for t in trials if t.user_attrs.get(schema.EVALUATED))),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", required=True)
    parser.add_argument("--json", help="also write the counts here")
    args = parser.parse_args(argv)

    import optuna

    from search.storing.storage import open_storage

    storage = open_storage(args.storage)
    out = [check_study(optuna.load_study(study_name=name, storage=storage)) for name in optuna.get_all_study_names(storage)]
    for s in out:
        print(f"{s['study']}: states {s['states']}; evaluated {s['evaluated']}; measured search trials {s['measured_search_trials']}, "
              f"distinct configs {s['distinct_configs']}, duplicate measurements {s['duplicate_measurements']}; failed {s['failed']} "
              f"requeued as {s['requeued']}; lost {s['lost']}; unfinished {s['unfinished']}; per worker {s['per_worker']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 1 if any(s["duplicate_measurements"] or s["lost"] or s["unfinished"] for s in out) else 0


if __name__ == "__main__":
    sys.exit(main())
