"""A helper process that answers one JSON line per request: the compile workers of the static check and of
the search's compile pipeline (a fresh interpreter each, so the DSL reads its arch from the environment).

The process gets its own session: a Ctrl-C in the terminal reaches only the parent, which stops after the
current trial, and not a compile under way (it would die and read as a compile error). It ends when its
stdin closes, also when the parent is killed. A thread reads its stdout: answers are never stranded in a
read buffer behind chatter that arrived with them.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading


class LineProcess:
    """`python -m MODULE ARGS` speaking JSON lines: `send` a request, poll `reply` for the line after `prefix`."""

    def __init__(self, module: str, args: list[str], env: dict, prefix: str, cwd: str | None = None):
        self.prefix = prefix
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=cwd,
            env={**os.environ, **env}, start_new_session=True,
        )
        self._answers: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(self.prefix):
                self._answers.put(json.loads(line[len(self.prefix):]))

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def send(self, request: dict) -> None:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def reply(self) -> dict | None:
        """The next answer the process wrote, else None; lines without the prefix are the compiler's chatter."""
        if self._answers.empty() and not self.alive():
            self._reader.join(timeout=5)  # it ended: let the reader take what it wrote last
        try:
            return self._answers.get_nowait()
        except queue.Empty:
            return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, kill: bool = False, timeout_s: float = 10.0) -> None:
        """Closes its stdin and waits for it to end (`kill`: at once), killing it after `timeout_s`."""
        if self.alive() and not kill:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.alive():
            self.proc.kill()
            self.proc.wait()
