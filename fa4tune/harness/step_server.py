"""A step server: one child process per GPU that runs the harness's steps for a whole tuning run.

A fresh child per evaluation pays for torch, the CuTe DSL and a CUDA context every time (about 10 s of a
28 s trial). The server's child (a fa4tune.harness.isolation.ChildProcess) stays: it keeps its imports, its CUDA
context, the L2-flush buffer, the experiment modules it loaded (with their in-memory compile caches) and
the gate's fp32 references (fa4tune.harness.steps.child_run_steps keeps them between jobs).

`StepServer.run_steps` has the semantics of one child per call: a death by signal (a segfault, a CUDA
fault), a non-zero exit or a step past its time limit (the child's process group is killed) marks the
step in flight `crash` or `timeout`, a step of several candidates first retried one candidate at a time
so only the one at fault is marked; then a fresh child goes on with the rest. A child whose CUDA context
a device fault made unusable retires (fa4tune.harness.isolation.retire) and is replaced before the next step.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Mapping, Sequence

from fa4tune.harness.isolation import OK, TIMEOUT, ChildProcess, ChildResult, open_log
from fa4tune.harness.measurement import ProblemResult

STEP_FUNCTION = "fa4tune.harness.steps:child_run_steps"  # the child side of a step (a generator of JSON values)
PRELOAD = ("fa4tune.harness.steps",)  # imported as the child starts (torch with it), while the parent goes on


class StepServer:
    """The parent's handle on a persistent step child: `run_steps` as many times as needed, then `close`
    (or use it as a context manager). Calls from several threads take turns."""

    def __init__(self, *, env: Mapping[str, str] | None = None, device: str = "cuda", cwd: str | None = None,
                 sys_path: Sequence[str] = (), timeout_s: float, startup_timeout_s: float,
                 function: str = STEP_FUNCTION, preload: Sequence[str] = PRELOAD, log_path: str | None = None):
        self.device = device
        self.timeout_s, self.startup_timeout_s = timeout_s, startup_timeout_s
        self.function = function
        self._options = {"env": env, "cwd": cwd, "sys_path": list(sys_path), "preload": list(preload)}
        self.pids: list[int] = []  # every child started, in order: more than one means restarts
        self._child: ChildProcess | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._log = open_log(log_path)  # every child's output, in turn
        # where the time went (the throughput bench reads it): child starts, and per step gate / timing / the rest
        self.stats = {"starts": 0, "startup_s": 0.0, "steps": 0, "step_s": 0.0, "gate_s": 0.0, "timing_s": 0.0, "check_s": 0.0}
        self._start()  # now: its imports overlap the caller's other work

    @property
    def pid(self) -> int | None:
        """The running child's process id (None between a failure and the next call)."""
        return self._child.pid if self._child is not None and self._child.alive() else None

    def _start(self) -> ChildProcess:
        self._child = ChildProcess(log=self._log, **self._options)
        self.pids.append(self._child.pid)
        return self._child

    def _call(self, kwargs: dict, timeout_s: float, on_value) -> ChildResult:
        """One job in the running child (a fresh one, with the startup limit, if there is none)."""
        child = self._child
        fresh = child is None or child.jobs == 0 or not child.alive()
        if child is None or not child.alive():
            if child is not None:
                child.kill()
            child = self._start()
        first = max(self.startup_timeout_s, timeout_s) if fresh else timeout_s
        called, seen = time.monotonic(), []

        def timed(value):
            if not seen and fresh:  # imports, CUDA context, L2 buffer: what a fresh child costs before its first step
                self.stats["starts"] += 1
                self.stats["startup_s"] += time.monotonic() - called
            seen.append(time.monotonic())
            on_value(value)

        outcome = child.call(self.function, kwargs, timeout_s=timeout_s, first_timeout_s=first, on_value=timed)
        if not child.alive():  # it failed, or retired: the next call starts a fresh one
            child.kill()
            self._child = None
        return outcome

    def run_steps(self, steps: Sequence, settings, on_result: Callable | None = None,
                  timeout_s: float | None = None) -> list[dict[str, ProblemResult]]:
        """results[i][candidate name] for every step (fa4tune.harness.steps.Step) and candidate, whatever happened;
        `on_result(step, name, result)` as each one arrives. `timeout_s`: per step (default the server's)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            if self._closed:
                raise RuntimeError("step_server: run_steps after close()")
            return self._run_steps(list(steps), settings, on_result, timeout_s)

    def _run_steps(self, steps: list, settings, on_result, timeout_s: float) -> list[dict[str, ProblemResult]]:
        results: list[dict[str, ProblemResult]] = [{} for _ in steps]
        queue: list[tuple[int, list[dict]]] = [(i, list(step.specs)) for i, step in enumerate(steps)]

        def record(index: int, name: str, result: ProblemResult) -> None:
            results[index][name] = result
            if on_result is not None:
                on_result(steps[index], name, result)

        def failed(index: int, specs: list[dict], status: str, reason: str) -> None:
            for spec in specs:
                record(index, spec["name"], ProblemResult(steps[index].problem.label, steps[index].direction, status, reason=reason))

        while queue:
            items, queue = queue, []
            started: list[int] = []
            finished: set[int] = set()
            retry: list[tuple[int, list[dict]]] = []

            def on_value(value, items=items, started=started, finished=finished, retry=retry):
                if "started" in value:
                    started.append(value["started"])
                    return
                index, specs = items[value["step"]]
                self._count(value)
                for name, data in value["results"].items():
                    record(index, name, ProblemResult.from_dict(data))
                if value.get("retry"):
                    retry.append((index, [s for s in specs if s["name"] in value["retry"]]))
                finished.add(value["step"])

            payload = [dataclasses.replace(steps[i], specs=specs).to_dict() for i, specs in items]
            kwargs = {"steps": payload, "settings": settings.to_dict(), "device": self.device}
            outcome = self._call(kwargs, timeout_s, on_value)
            in_flight = next((p for p in reversed(started) if p not in finished), None)
            rest = [item for p, item in enumerate(items) if p not in finished and p != in_flight]
            queue = retry + rest
            status = "timeout" if outcome.status == TIMEOUT else "crash"
            reason = outcome.reason or "the child process stopped"
            if in_flight is not None:
                index, specs = items[in_flight]
                if len(specs) > 1:
                    queue[:0] = [(index, [spec]) for spec in specs]  # find out which candidate it was
                else:
                    failed(index, specs, status, reason)
            elif outcome.status != OK and not finished and not retry and queue:
                # the child died before starting any step (its imports, say): charge the next step so the run ends
                index, specs = queue.pop(0)
                failed(index, specs, status, reason)
        return results

    def _count(self, value: dict) -> None:
        seconds = value.get("seconds") or {}
        self.stats["steps"] += 1
        self.stats["gate_s"] += seconds.get("gate", 0.0)
        self.stats["timing_s"] += seconds.get("timing", 0.0)
        self.stats["check_s"] += seconds.get("check", 0.0)  # (part of timing_s: the timed outputs' check)
        self.stats["step_s"] += seconds.get("gate", 0.0) + seconds.get("timing", 0.0)

    def close(self) -> None:
        """End the child (it exits when idle; killed if it does not within seconds) and the log."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._child is not None:
                self._child.stop()
                self._child = None
            self._log.close()

    def __enter__(self) -> "StepServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
