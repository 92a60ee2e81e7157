"""Trials that outlive their worker: Optuna's heartbeat on the RDB storage, and stale trials queued again.

A worker records a heartbeat for the trial it works on every `interval_s` seconds (a thread, so a long
GPU evaluation keeps beating). Before each trial, every worker fails the study's RUNNING trials whose
heartbeat is older than `grace_s` (optuna.storages.fail_stale_trials); the storage's stale-trial callback
enqueues each one's params again with its proposer's attributes and `requeued_from`, as
search.storing.study.close_interrupted does for a single run. A config whose trials went stale `max_retry` times
in a row (it kills its worker each time) is not queued again.
"""

from __future__ import annotations

import threading
import warnings

import optuna
from optuna.trial import FrozenTrial

from fa4tune.config import ConfigError
from search.storing import schema
from search.storing.study import requeue, requeue_params

MAX_RETRY = 2

# ask/tell with a heartbeat is what we do on purpose; Optuna warns because optimize() is its usual user.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


class RequeueStale:
    """The stale-trial callback: enqueue the trial's params again (kept attrs + requeued_from); remembers what it did."""

    def __init__(self, max_retry: int = MAX_RETRY):
        self.max_retry = max_retry
        self.requeued: list[int] = []  # trial numbers this process closed and queued again
        self.dropped: list[int] = []  # ... and those it did not queue again (retried too often)

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if not requeue_params(trial):
            return
        if _retries(study, trial) >= self.max_retry:
            self.dropped.append(trial.number)
            return
        requeue(study, trial)
        self.requeued.append(trial.number)


def _retries(study: optuna.Study, trial: FrozenTrial) -> int:
    """How many times in a row this trial's params were already requeued (the requeued_from chain)."""
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    count, current = 0, trial
    while (previous := current.user_attrs.get(schema.REQUEUED_FROM)) is not None and previous in by_number:
        count, current = count + 1, by_number[previous]
    return count


def enable(storage, interval_s: int, grace_s: int, max_retry: int = MAX_RETRY) -> RequeueStale:
    """Turns on the heartbeat of an RDBStorage (as its constructor's heartbeat_interval/grace_period/callback would)."""
    for name, value in (("heartbeat", interval_s), ("grace", grace_s)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError("heartbeat", f"--{name} must be a whole number of seconds >= 1, got {value!r}")
    if grace_s <= interval_s:
        raise ConfigError("heartbeat", f"--grace ({grace_s} s) must be longer than --heartbeat ({interval_s} s)")
    callback = RequeueStale(max_retry)
    storage.heartbeat_interval = interval_s
    storage.grace_period = grace_s
    storage.heartbeat_stale_trial_callback = callback
    storage.failed_trial_callback = callback  # the deprecated alias RDBStorage also keeps
    return callback


def fail_stale(study: optuna.Study) -> None:
    """Fails trials whose worker stopped beating; the storage's callback queues them again."""
    optuna.storages.fail_stale_trials(study)


class Heartbeat:
    """Context manager: beats for one trial from a thread until the block ends."""

    def __init__(self, storage, trial: optuna.Trial):
        self.storage = storage
        self.trial_id = trial._trial_id  # Optuna's own heartbeat thread takes the storage id the same way
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{trial.number}", daemon=True)

    def __enter__(self):
        self.storage.record_heartbeat(self.trial_id)  # at once: a trial without a heartbeat is never found stale
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False

    def _beat(self) -> None:
        interval = self.storage.get_heartbeat_interval()
        while not self._stop.wait(interval):
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception:  # a database hiccup: the next beat tries again (the grace period covers a few)
                pass
