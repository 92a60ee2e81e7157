"""The compile pipeline: candidates compile ahead in CPU processes; the GPU process only loads and times them.

    callers (one thread per trial in flight) --submit--> CompilePool (N compiler processes)
        --compiled--> ready queue (bounded) --> the consumer (one thread, the GPU): several ready candidates
        per harness child, each kernel loaded from the disk cache (fa4tune.kernel_cache)

The consumer never waits while a compiled candidate is ready: a caller puts its candidate in the queue the
moment its compile ends, and the consumer takes everything ready when it comes back. `stats` records when
each candidate became ready and was taken, and every wait of the consumer (the tests and bench read it).

What it saves: compile errors and kernels whose compiled shared storage exceeds the target end in the
compile stage and cost no GPU time; the GPU process loads each kernel instead of compiling it; several
ready candidates share one harness child (one start of torch and the DSL). What it does not save: the
child still starts once per batch and loads each kernel, and gate and timing take what they take.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fa4tune.line_process import LineProcess

ROOT = Path(__file__).resolve().parents[2]  # the project root: the compiler processes import search from there
RESULT_PREFIX = "FA4TUNE-COMPILED "
COMPILE_TIMEOUT_S = 300.0


# ------------------------------------------------------------------------------------------------
# Compiler processes: `python -m search.evaluating.pipeline MODULE:FUNCTION`, a JSON job per line in, a result line out.
# ------------------------------------------------------------------------------------------------


class _Compiler:
    """One compiler process (`python -m search.evaluating.pipeline FUNCTION`) and the job it works on."""

    def __init__(self, function: str, env: dict, sys_path: list[str]):
        path = os.pathsep.join([*sys_path, str(ROOT), os.environ.get("PYTHONPATH", "")])
        self.dump_dir = tempfile.mkdtemp(prefix="fa4tune-compile-")
        self.proc = LineProcess("search.evaluating.pipeline", [function], {**env, "CUTE_DSL_DUMP_DIR": self.dump_dir, "PYTHONPATH": path},
                                RESULT_PREFIX, cwd=str(ROOT))
        self.job: tuple | None = None  # (job, future, started)

    def send(self, job: dict, future: Future) -> None:
        self.job = (job, future, time.monotonic())
        self.proc.send(job)

    def reply(self):
        """The result once the process answered, else None."""
        return self.proc.reply()

    def alive(self) -> bool:
        return self.proc.alive()

    def stop(self) -> None:
        self.proc.stop(timeout_s=5)
        for path in Path(self.dump_dir).glob("*"):
            path.unlink(missing_ok=True)
        os.rmdir(self.dump_dir)


class CompilePool:
    """`jobs` compiler processes running `function(job) -> dict` (a "module:function" path), one job each at a time.

    A job that runs past `timeout_s` kills its process (a fresh one takes its place) and comes back as
    {"status": "compile_error", "reason": "compile ran past ...", "timed_out": True}; a job whose process died
    comes back as a compile_error too.
    """

    def __init__(self, function: str, jobs: int, env: dict | None = None, timeout_s: float = COMPILE_TIMEOUT_S, sys_path: list[str] | None = None):
        self.function, self.env, self.timeout_s, self.sys_path = function, dict(env or {}), timeout_s, list(sys_path or [])
        self._compilers = [_Compiler(function, self.env, self.sys_path) for _ in range(max(1, jobs))]
        self._pending: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._dispatch, name="compile-pool", daemon=True)
        self._thread.start()

    def submit(self, job: dict) -> Future:
        """A future of the job's result dict."""
        future: Future = Future()
        self._pending.put((job, future))
        return future

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        for compiler in self._compilers:
            compiler.stop()

    def _dispatch(self) -> None:
        while not self._closed.is_set():
            for compiler in self._compilers:
                if compiler.job is None and not self._pending.empty():
                    compiler.send(*self._pending.get())
            time.sleep(0.02)
            for n, compiler in enumerate(self._compilers):
                if compiler.job is None:
                    continue
                job, future, started = compiler.job
                result = compiler.reply()
                if result is None and not compiler.alive():
                    result = {"status": "compile_error", "reason": f"the compiler process died (exit code {compiler.proc.returncode})"}
                elif result is None and time.monotonic() - started > self.timeout_s:
                    result = {"status": "compile_error", "reason": f"compile ran past {self.timeout_s:.0f} s and was killed", "timed_out": True}
                if result is None:
                    continue
                compiler.job = None
                if not compiler.alive() or result.get("timed_out"):
                    compiler.stop()
                    self._compilers[n] = _Compiler(self.function, self.env, self.sys_path)
                future.set_result(result)
        while not self._pending.empty():
            self._pending.get()[1].set_result({"status": "compile_error", "reason": "the compile pool was closed"})
        for compiler in self._compilers:
            if compiler.job is not None:
                compiler.job[1].set_result({"status": "compile_error", "reason": "the compile pool was closed"})
                compiler.job = None


def serve(function: str) -> None:
    """Compiler process: call `function` on each JSON job from stdin; an exception is the job's compile error."""
    import importlib
    import traceback
    import warnings

    warnings.filterwarnings("ignore")
    module, name = function.split(":")
    fn = getattr(importlib.import_module(module), name)
    for line in sys.stdin:
        try:
            result = fn(json.loads(line))
        except Exception as err:
            result = {"status": "compile_error", "reason": traceback.format_exception_only(type(err), err)[-1].strip()[:500]}
        result.setdefault("reason", "")
        sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
        sys.stdout.flush()


# ------------------------------------------------------------------------------------------------
# The pipeline: compile (pool) -> ready queue (bounded) -> one consumer.
# ------------------------------------------------------------------------------------------------


@dataclass
class Ready:
    """A compiled candidate waiting for the consumer."""

    job: dict
    compiled: dict
    ready_at: float
    payload: object = None
    future: Future = field(default_factory=Future)
    taken_at: float | None = None


@dataclass
class Stats:
    """Timestamps (time.monotonic) of the consumer's work, for the tests and the benchmark."""

    waits: list[tuple[float, float]] = field(default_factory=list)  # the consumer idle, waiting for a candidate
    batches: list[tuple[float, float, int]] = field(default_factory=list)  # (start, end, candidates) evaluating
    handoffs: list[tuple[float, float]] = field(default_factory=list)  # (ready_at, taken_at) per candidate
    skipped: int = 0  # candidates that ended in the compile stage (no GPU time)

    def busy_seconds(self) -> float:
        return sum(end - start for start, end, _ in self.batches)


class Pipeline:
    """Compile ahead in a CompilePool, evaluate ready candidates in one consumer thread.

    `evaluate(batch, done)` runs on the consumer thread with up to `max_batch` Ready items and calls
    `done(item, result)` for each as its result arrives. `run(job)` is called from any number of threads.
    """

    def __init__(self, pool: CompilePool, evaluate: Callable[[list[Ready], Callable], None], ready_capacity: int = 4, max_batch: int = 8):
        self.pool = pool
        self.evaluate = evaluate
        self.max_batch = max_batch
        self.stats = Stats()
        self._ready: queue.Queue = queue.Queue(maxsize=ready_capacity)
        self._lock = threading.Lock()
        self._stopped = False
        self._consumer = threading.Thread(target=self._consume, name="pipeline-consumer", daemon=True)
        self._consumer.start()

    def run(self, job: dict, payload=None) -> tuple[dict, object]:
        """(compile result, evaluation result); the evaluation is None when the compile stage ended the candidate.
        `payload` travels with the candidate to the consumer (e.g. the trial's pruning monitor)."""
        compiled = self.pool.submit(job).result()
        if compiled.get("status") != "ok":
            with self._lock:
                self.stats.skipped += 1
            return compiled, None
        item = Ready(job, compiled, time.monotonic(), payload=payload)
        self._ready.put(item)  # blocks while the queue is full: compiles run no further ahead than that
        return compiled, item.future.result()

    def close(self) -> None:
        self._stopped = True
        self._ready.put(None)
        self._consumer.join()
        self.pool.close()

    def _consume(self) -> None:
        while True:
            start = time.monotonic()
            item = self._ready.get()
            taken = time.monotonic()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    more = self._ready.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._ready.put(None)
                    break
                batch.append(more)
            with self._lock:
                if taken - start > 0.001:
                    self.stats.waits.append((start, taken))
                for b in batch:
                    b.taken_at = taken
                    self.stats.handoffs.append((b.ready_at, taken))

            def done(ready: Ready, result) -> None:
                if not ready.future.done():
                    ready.future.set_result(result)

            try:
                self.evaluate(batch, done)
            except Exception as err:  # the consumer must outlive an evaluation bug: the callers get the error
                for b in batch:
                    if not b.future.done():
                        b.future.set_exception(err)
            for b in batch:
                if not b.future.done():
                    b.future.set_exception(RuntimeError("the evaluation returned no result for this candidate"))
            with self._lock:
                self.stats.batches.append((taken, time.monotonic(), len(batch)))


if __name__ == "__main__":
    serve(sys.argv[1])
