"""Run one evaluation in a child process, so that a segfault, a CUDA fault or a hang costs only that evaluation.

The child (`python -m fa4tune.isolation FD`) reads a job from stdin, `{"function": "module:name", "kwargs": {...},
"sys_path": [...]}`, calls the function and writes each value it yields (or the one value it returns) as a JSON
line to the pipe FD. Every value resets the time limit, so a long evaluation that reports after each step
is limited per step. The parent turns a death by signal, a non-zero exit or a step past the limit (the child's
whole process group is killed) into a `ChildResult` with status "crash" or "timeout" and a reason, and keeps
the values that arrived before. The child's stdout and stderr go to a log, whose last lines explain crashes.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

OK, CRASH, TIMEOUT = "ok", "crash", "timeout"
LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class ChildResult:
    """How a child run ended, and what it sent before."""

    status: str  # "ok" | "crash" | "timeout"
    values: tuple = ()  # JSON values the child sent, in order
    reason: str = ""
    exit_code: int | None = None
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


def _tail(log_file, lines: int = LOG_TAIL_LINES) -> str:
    log_file.flush()
    log_file.seek(0, os.SEEK_END)
    size = log_file.tell()
    log_file.seek(max(0, size - 64 * 1024))
    text = log_file.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


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
    job = json.dumps({"function": function, "kwargs": dict(kwargs or {}), "sys_path": list(sys_path)}).encode()
    read_fd, write_fd = os.pipe()
    log = open(log_path, "w+b") if log_path else tempfile.TemporaryFile()
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fa4tune.isolation", str(write_fd)],
            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, pass_fds=(write_fd,),
            env=None if env is None else dict(env), cwd=cwd,
            start_new_session=True,  # its own process group: a kill also reaches compiler workers it started
        )
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        log.close()
        raise
    os.close(write_fd)
    values: list = []
    status, reason = None, ""
    try:
        try:
            proc.stdin.write(job)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the child died before reading its job; its exit status says why
        pending = b""
        limit = timeout_s if startup_timeout_s is None else startup_timeout_s
        deadline = time.monotonic() + limit
        child_error = ""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waited = "its first result" if not values else "its next result after the last"
                status, reason = TIMEOUT, f"no progress: waited {limit:g} s for {waited}; the child was killed"
                break
            ready, _, _ = select.select([read_fd], [], [], min(remaining, 1.0))
            if not ready:
                continue
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break  # the child closed the pipe: it finished or died
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                message = json.loads(line)
                if "error" in message:
                    child_error = message["error"]
                    continue
                values.append(message["value"])
                limit = timeout_s
                deadline = time.monotonic() + limit
                if on_value is not None:
                    on_value(message["value"])
        if status == TIMEOUT:
            _kill_group(proc)
        else:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                status, reason = TIMEOUT, f"the child did not exit within {timeout_s:g} s after its last result; killed"
        returncode = proc.wait()
        tail = _tail(log)
        if status is None:
            if returncode == 0 and not child_error:
                status = OK
            else:
                status = CRASH
                detail = child_error or _last_line(tail)
                reason = describe_exit(returncode) + (f": {detail}" if detail else "")
        return ChildResult(status, tuple(values), reason, returncode, time.monotonic() - started, tail)
    finally:
        if proc.poll() is None:
            _kill_group(proc)
        os.close(read_fd)
        log.close()


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the child and everything it started (its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# ------------------------------------------------------------------------------------------------
# Child side.
# ------------------------------------------------------------------------------------------------


def resolve(function: str):
    """The object named 'module:attribute' (dotted attributes allowed)."""
    import importlib

    module_name, _, name = function.partition(":")
    target = importlib.import_module(module_name)
    for part in name.split("."):
        target = getattr(target, part)
    return target


def child_main(argv: Sequence[str]) -> int:
    """Entry point of the child: run the job from stdin, send values to the pipe fd in argv[0]."""
    import faulthandler
    import inspect
    import traceback

    faulthandler.enable()  # a segfault still kills the child, but its log shows where
    out = os.fdopen(int(argv[0]), "w", buffering=1)

    def send(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    try:
        job = json.loads(sys.stdin.read())
        for entry in reversed(job.get("sys_path", [])):
            sys.path.insert(0, entry)
        result = resolve(job["function"])(**job.get("kwargs", {}))
        if inspect.isgenerator(result):
            for value in result:
                send({"value": value})
        else:
            send({"value": result})
    except BaseException as err:  # noqa: BLE001 - any failure is reported to the parent, then exit 1
        traceback.print_exc()
        send({"error": "".join(traceback.format_exception_only(type(err), err)).strip()[:2000]})
        out.close()
        return 1
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
