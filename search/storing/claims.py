"""Several workers on one study, with the Optuna storage as the only meeting point.

- A study lock (a PostgreSQL advisory lock, or a lock file next to a SQLite database) around the few
  reads and writes that must not interleave: taking a turn, asking for a trial, claiming its config.
- Claims: before it evaluates, a worker marks its trial with `worker`. A config that another trial already
  measured is copied (`duplicate_of`); one that a claimed trial is measuring right now is waited for,
  then copied. Confirmations are measured again on purpose and claim nothing.
- Shares: the turn policy counts every trial in the storage by its `proposer`, including those other
  workers are running or have queued, and the proposer turns in progress (`pending_turns`), so the ratio
  holds across workers.

The attributes (search.storing.schema): on a trial `worker`; on a study `pending_turns`, and `search_settings`
(what `run --workers` decided: workers read it) and `problem_specs` (the problems in full), which
search.running.launch writes.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import optuna
from optuna.trial import TrialState

from search.storing import schema
from search.storing.history import TrialRecord, config_key, records

PENDING_TURN_TTL_S = 900.0  # a proposer turn older than this belongs to a dead worker
IN_FLIGHT = (TrialState.RUNNING, TrialState.WAITING)


def default_worker_id() -> str:
    """'host:pid'."""
    return f"{socket.gethostname()}:{os.getpid()}"


# ------------------------------------------------------------------------------------------------
# The study lock.
# ------------------------------------------------------------------------------------------------


class StudyLock:
    """Mutual exclusion between every worker of a study, wherever they run (re-entrant per thread)."""

    def __init__(self, storage, study_name: str):
        self.storage = storage
        self.study_name = study_name
        self.key = int.from_bytes(hashlib.sha256(study_name.encode()).digest()[:8], "big", signed=True)
        self._local = threading.Lock()  # threads of one process queue here first
        self._owner: int | None = None
        self._depth = 0

    @contextmanager
    def held(self):
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        with self._local:
            self._owner = me
            try:
                with self._across_processes():
                    yield
            finally:
                self._owner = None

    @contextmanager
    def _across_processes(self):
        engine = getattr(self.storage, "engine", None)
        dialect = engine.dialect.name if engine is not None else ""
        if dialect == "postgresql":
            import sqlalchemy

            with engine.connect() as connection:
                connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": self.key})
                try:
                    yield
                finally:
                    connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": self.key})
                    connection.commit()
        elif dialect == "sqlite" and engine.url.database not in (None, "", ":memory:"):
            # SQLite is reached through a local file only: a lock file next to it reaches every process
            fd = os.open(f"{engine.url.database}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
        else:  # an in-memory storage lives in one process
            yield


# ------------------------------------------------------------------------------------------------
# Claims.
# ------------------------------------------------------------------------------------------------


def _same_config(trial, key: tuple, space) -> bool:
    return config_key(trial.user_attrs.get(schema.CONFIG) or space.config(trial.params).to_dict()) == key


def find_claim(study: optuna.Study, trial: optuna.Trial, config, space) -> tuple[str, int | None]:
    """('measured', n): trial n measured this config; ('measuring', n): claimed trial n is measuring it now;
    ('free', None) otherwise. Call with the study lock held."""
    key = config_key(config.to_dict())
    for other in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)):
        if other.number == trial.number or other.user_attrs.get(schema.CONFIRMATION_OF) is not None:
            continue
        if not _same_config(other, key, space):
            continue
        if other.state != TrialState.RUNNING and other.user_attrs.get(schema.EVALUATED):
            return "measured", other.number
        if other.state == TrialState.RUNNING and other.user_attrs.get(schema.WORKER):
            return "measuring", other.number
    return "free", None


def in_flight_evaluations(trials: list) -> int:
    """Search trials that some worker claimed and has not finished (they count towards n_trials), in one snapshot
    of the study's trials (the one its history was read from: a trial that finished between two reads would count
    in neither, and the budget would run one over)."""
    return sum(1 for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get(schema.WORKER)
               and t.user_attrs.get(schema.CONFIRMATION_OF) is None)


# ------------------------------------------------------------------------------------------------
# Shares of the turn policy.
# ------------------------------------------------------------------------------------------------


def pending_turns(study: optuna.Study, now: float | None = None) -> dict[str, dict]:
    """Proposer turns other workers are taking right now (older ones belonged to dead workers)."""
    now = time.time() if now is None else now
    turns = study.user_attrs.get(schema.PENDING_TURNS) or {}
    return {w: t for w, t in turns.items() if t and now - t.get("since", 0) < PENDING_TURN_TTL_S}


def set_pending_turn(study: optuna.Study, worker: str, proposer: str | None, k: int = 0) -> None:
    """Records (or, with proposer None, clears) this worker's proposer turn; call with the study lock held."""
    turns = dict(study.user_attrs.get(schema.PENDING_TURNS) or {})
    if proposer is None:
        if worker not in turns:
            return
        turns.pop(worker)
    else:
        turns[worker] = {"proposer": proposer, "k": k, "since": time.time()}
    study.set_user_attr(schema.PENDING_TURNS, turns)


def counted_history(history: list[TrialRecord], pending: dict[str, dict]) -> list[TrialRecord]:
    """The history as the turn policy should count it: trials in flight as if finished, and each pending
    proposer turn as its k trials (placeholders with number -1)."""
    counted = [replace(r, state="COMPLETE") if r.state in ("RUNNING", "WAITING") and r.proposer else r for r in history]
    for turn in pending.values():
        counted += [TrialRecord(-1, "COMPLETE", turn["proposer"], {}, "", None)] * max(1, int(turn.get("k", 1)))
    return counted


def shares(study: optuna.Study) -> dict[str, int]:
    """Search trials per proposer, finished or in flight (what the turn policy compares)."""
    counts: dict[str, int] = {}
    for r in counted_history(records(study), {}):
        if r.is_search:
            counts[r.proposer] = counts.get(r.proposer, 0) + 1
    return counts
