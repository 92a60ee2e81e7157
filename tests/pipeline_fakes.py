"""A fake compiler for the pipeline tests: sleeps instead of compiling (it runs in search.evaluating.pipeline's compiler processes)."""

from __future__ import annotations

import time


def slow_compile(job: dict) -> dict:
    """Sleeps job["compile_s"]; a job with "fail" ends as a compile error, one with "crash" kills its process."""
    time.sleep(job["compile_s"])
    if job.get("crash"):
        import os

        os._exit(3)
    if job.get("fail"):
        return {"status": "compile_error", "reason": f"candidate {job['id']} does not compile"}
    return {"status": "ok", "id": job["id"], "pid": __import__("os").getpid()}
