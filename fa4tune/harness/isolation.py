"""Run evaluations in a child process, so that a segfault, a CUDA fault or a hang costs only that evaluation.

A `ChildProcess` (`python -m fa4tune.harness.isolation FD SETUP`) imports what SETUP names, then runs jobs sent
to its stdin as JSON lines, `{"function": "module:name", "kwargs": {...}}`, one after another: each value
the function yields (or the one value it returns) goes to the pipe FD as a JSON line, then a line saying
the job is done. Every value resets the time limit, so a long evaluation that reports after each step is
limited per step. The parent turns a death by signal, a non-zero exit or a value past the limit (the
child's whole process group is killed) into a `ChildResult` with status "crash" or "timeout" and a reason,
and keeps the values that arrived before. The child's stdout and stderr go to a log, whose last lines
explain crashes. `run_in_child` runs one job in a fresh process; fa4tune.harness.step_server keeps one for many.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

OK, CRASH, TIMEOUT = "ok", "crash", "timeout"
LOG_TAIL_LINES = 20
LOG_TAIL_BYTES = 64 * 1024
EXIT_WAIT_S = 10.0  # a child that finished its job or closed its pipe gets this long to exit


@dataclass(frozen=True)
class ChildResult:
    """How a child's job ended, and what it sent before."""

    status: str  # "ok" | "crash" | "timeout"
    values: tuple = ()  # JSON values the child sent, in order
    reason: str = ""
    exit_code: int | None = None  # None while the child lives on for the next job
    seconds: float = 0.0
    log_tail: str = ""

    @property
    def value(self):
        """The last value sent (a plain function's return value), or None."""
        return self.values[-1] if self.values else None


def describe_exit(returncode: int) -> str:
    """'killed by signal SIGSEGV' or 'exit code 1'."""
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def open_log(path: str | None = None):
    """A log for children (a temporary file without `path`), appended to whatever offset the parent reads at."""
    log = open(path, "a+b") if path else tempfile.TemporaryFile()
    fcntl.fcntl(log.fileno(), fcntl.F_SETFL, fcntl.fcntl(log.fileno(), fcntl.F_GETFL) | os.O_APPEND)
    return log


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the child and everything it started (its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


class ChildProcess:
    """One child process that runs jobs in turn: `call` one, read its values until it is done, dies or runs
    past a limit. It runs in its own session: a Ctrl-C in the terminal reaches only the parent."""

    def __init__(self, *, log, env: Mapping[str, str] | None = None, cwd: str | None = None, sys_path: Sequence[str] = (),
                 preload: Sequence[str] = ()):
        self.log = log  # open_log(): the caller's, kept for the children after this one
        self.log.write(f"--- child process starting ({time.strftime('%H:%M:%S')}) ---\n".encode())
        self.log.flush()
        self.log_start = self.log.seek(0, os.SEEK_END)
        setup = json.dumps({"sys_path": list(sys_path), "preload": list(preload)})
        read_fd, write_fd = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fa4tune.harness.isolation", str(write_fd), setup],
                stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT, pass_fds=(write_fd,),
                env=None if env is None else dict(env), cwd=cwd,
                start_new_session=True,  # its own process group: a kill reaches compiler workers; no terminal Ctrl-C
            )
        except BaseException:
            os.close(read_fd)
            os.close(write_fd)
            raise
        os.close(write_fd)
        self.read_fd = read_fd
        self.jobs = 0  # jobs sent so far
        self._pending = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self) -> str:
        """The last lines this child wrote to the log."""
        self.log.flush()
        end = os.fstat(self.log.fileno()).st_size
        start = max(self.log_start, end - LOG_TAIL_BYTES)
        text = os.pread(self.log.fileno(), end - start, start).decode(errors="replace")
        return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])

    def call(self, function: str, kwargs: Mapping | None = None, *, timeout_s: float, first_timeout_s: float | None = None,
             on_value: Callable[[object], None] | None = None) -> ChildResult:
        """Run `module:function(**kwargs)` in the child with a per-value time limit (`first_timeout_s`, if given,
        for the first value instead). Afterwards the child is `alive()` for another job unless it failed or retired."""
        started = time.monotonic()
        self.jobs += 1
        try:
            self.proc.stdin.write((json.dumps({"function": function, "kwargs": dict(kwargs or {})}) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            pass  # it died before reading the job; its exit status says why
        values: list = []
        limit = timeout_s if first_timeout_s is None else first_timeout_s
        deadline = started + limit
        child_error = ""
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    waited = "its first result" if not values else "its next result after the last"
                    self.kill()
                    reason = f"no progress: waited {limit:g} s for {waited}; the child was killed"
                    return ChildResult(TIMEOUT, tuple(values), reason, self.proc.returncode, time.monotonic() - started, self.log_tail())
                ready, _, _ = select.select([self.read_fd], [], [], min(remaining, 1.0))
                if not ready:
                    continue
                chunk = os.read(self.read_fd, 1 << 16)
                if not chunk:
                    break  # the child closed the pipe: it died, or exits after an error
                self._pending += chunk
                *lines, self._pending = self._pending.split(b"\n")
                for line in lines:
                    message = json.loads(line)
                    if "error" in message:
                        child_error = message["error"]
                    elif "done" in message:
                        if message.get("retiring"):
                            self.stop()
                        return ChildResult(OK, tuple(values), "", self.proc.returncode, time.monotonic() - started)
                    else:
                        values.append(message["value"])
                        limit = timeout_s
                        deadline = time.monotonic() + limit
                        if on_value is not None:
                            on_value(message["value"])
        except BaseException:
            self.kill()  # the caller stops mid-job (its callback raised, or Ctrl-C): this child cannot be reused
            raise
        try:
            returncode = self.proc.wait(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            returncode = self.proc.returncode
        tail = self.log_tail()
        detail = child_error or _last_line(tail)
        reason = describe_exit(returncode) + (f": {detail}" if detail else "")
        return ChildResult(CRASH, tuple(values), reason, returncode, time.monotonic() - started, tail)

    def stop(self) -> None:
        """Close its stdin (it exits when idle) and wait; kill its process group if it does not exit."""
        if self.alive():
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=EXIT_WAIT_S)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        """Kill its process group if it still runs; release its pipes."""
        if self.alive():
            _kill_group(self.proc)
        self.proc.wait()
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1
        try:
            self.proc.stdin.close()
        except OSError:
            pass


def run_in_child(
    function: str,
    kwargs: Mapping | None = None,
    *,
    timeout_s: float,
    startup_timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    sys_path: Sequence[str] = (),
    cwd: str | None = None,
    log_path: str | None = None,
    on_value: Callable[[object], None] | None = None,
) -> ChildResult:
    """Call `module:function(**kwargs)` in a fresh Python process with a per-value time limit
    (`startup_timeout_s`, if given, is the limit for the first value instead, imports included)."""
    log = open_log(log_path)
    child = None
    try:
        child = ChildProcess(env=env, cwd=cwd, sys_path=sys_path, log=log)
        result = child.call(function, kwargs, timeout_s=timeout_s, first_timeout_s=startup_timeout_s, on_value=on_value)
        child.stop()
        return replace(result, exit_code=child.proc.returncode, log_tail=child.log_tail())
    finally:
        if child is not None:
            child.kill()
        log.close()


# ------------------------------------------------------------------------------------------------
# Child side.
# ------------------------------------------------------------------------------------------------

_RETIRING = False


def resolve(function: str):
    """The object named 'module:attribute' (dotted attributes allowed)."""
    import importlib

    module_name, _, name = function.partition(":")
    target = importlib.import_module(module_name)
    for part in name.split("."):
        target = getattr(target, part)
    return target


def retire() -> None:
    """Child side: end this process once the current job is done (e.g. a device fault made its CUDA context
    unusable); the parent sees it and starts a fresh one for the next job."""
    global _RETIRING
    _RETIRING = True


def child_main(argv: Sequence[str]) -> int:
    """Entry point of the child: argv is (values fd, setup JSON); jobs are JSON lines on stdin."""
    import faulthandler
    import importlib
    import inspect
    import traceback

    faulthandler.enable()  # a segfault still kills the child, but its log shows where
    out = os.fdopen(int(argv[0]), "w", buffering=1)

    def send(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    try:
        setup = json.loads(argv[1]) if len(argv) > 1 else {}
        for entry in reversed(setup.get("sys_path", [])):
            sys.path.insert(0, entry)
        for module in setup.get("preload", []):
            importlib.import_module(module)  # before the first job: the imports overlap the parent's work
        for line in sys.stdin:
            if not line.strip():
                continue
            job = json.loads(line)
            result = resolve(job["function"])(**job.get("kwargs", {}))
            for value in result if inspect.isgenerator(result) else [result]:
                send({"value": value})
            send({"done": True, "retiring": _RETIRING})
            if _RETIRING:
                break
    except BaseException as err:  # noqa: BLE001 - any failure is reported to the parent, then exit 1
        traceback.print_exc()
        send({"error": "".join(traceback.format_exception_only(type(err), err)).strip()[:2000]})
        out.close()
        return 1
    out.close()
    return 0


if __name__ == "__main__":
    # run as the package's module, not as __main__: `retire` must set the flag that child_main reads
    from fa4tune.harness import isolation

    sys.exit(isolation.child_main(sys.argv[1:]))
