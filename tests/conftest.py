import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# the static facts cache (default: .cache/ in the working directory) of this process and of every command a test
# starts: a temporary folder, set before fa4tune.static_check reads it at import
os.environ.setdefault("FA4TUNE_CACHE_DIR", tempfile.mkdtemp(prefix="fa4tune-test-cache-"))


def _keep_static_workers() -> None:
    """`run_static` (fa4tune.static_check) with its compile workers kept between calls in this pytest process.

    Each call of the one-call form starts its workers, and each worker imports torch, the CuTe DSL and flash-attn-4
    before it compiles (about 13 s on the 2-core CI machine): a dozen calls across the compile tests paid that a
    dozen times. Here one StaticChecker (the kept form the search's GPU evaluator uses) serves consecutive calls with
    the same target, experiment.py, worker count, timeout and compile-relevant environment; a call with other ones
    starts its own, and the two most recently used are kept (a test's own experiment.py between two of the tree's
    does not cost the tree's checker its worker: about 7 s a start). The facts cache is the call's own (set per
    call): a test with its own cache file sees its own. Patched when conftest is imported, before the test modules
    bind the name."""
    import atexit
    import hashlib
    import os

    from fa4tune import static_check

    kept: dict = {}  # key -> StaticChecker, least recently used first

    def run_static(jobs, target, experiment_path="experiment.py", workers=None, timeout_s=300.0,
                   cache_path=static_check.DEFAULT_CACHE, on_result=None):
        env = sorted((k, v) for k, v in os.environ.items() if k.startswith(("FA4TUNE_", "CUTE_", "FLASH_ATTENTION_", "CUDA")))
        key = (target.name, str(Path(experiment_path).resolve()), workers, timeout_s, hashlib.sha256(repr(env).encode()).hexdigest())
        if key not in kept:
            while len(kept) >= KEPT_CHECKERS:  # the least recently used goes
                kept.pop(next(iter(kept))).close()
            kept[key] = static_check.StaticChecker(target, experiment_path, workers, timeout_s, cache_path)
        checker = kept[key] = kept.pop(key)  # the most recently used last
        checker.cache = static_check.FactsCache(cache_path)
        return checker.check(jobs, on_result)

    static_check.run_static = run_static
    atexit.register(lambda: [checker.close() for checker in kept.values()])


KEPT_CHECKERS = 2
_keep_static_workers()


@pytest.fixture
def this_experiment(request, monkeypatch):
    """The registry reads the module loaded as `experiment`; a test before may leave another there (an agent's copy,
    tests/test_kernel_protocol.py): put back the one the requesting test module imported (this tree's experiment.py)."""
    experiment = request.module.experiment
    monkeypatch.setitem(sys.modules, "experiment", experiment)
    return experiment


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (the README's `uv run pytest`) on a machine of at most 4 cores: one worker more than the cores. Many
    tests wait (PostgreSQL, search workers' replay delays, CLI subprocesses, Chromium) while another compiles; on the
    2-core CI machine 3 workers ran the suite in 637 s where 2 took 677 s (2026-12-07 s15, the same tree). Larger
    machines keep a worker per core."""
    cores = os.cpu_count() or 1
    return cores + 1 if cores <= 4 else cores


# The slowest files first (seconds on the 2-core CI machine, docs/measurements/2026-12-05-test-suite-time.md). Each
# file runs whole on one worker (--dist loadfile), in collection order: a long file collected last would keep one
# core busy while the other idles; longest first leaves the short files to even out the end.
# Order of 2026-12-07 s15 (2 workers: 102, 96, 85, 55, 48, 43, 37, 35, 35, 34, 32, 29 ... s per file).
SLOW_FIRST = ("test_search_export_series.py", "test_search_workers.py", "test_search_export.py", "test_static_check.py",
              "test_bench_upstream_tests.py", "test_fp8_kernel.py", "test_readme.py", "test_tma_kernel.py",
              "test_search_resume.py", "test_splitkv.py", "test_learnable_sink.py", "test_backward_kernel_protocol.py",
              "test_optional_packages.py", "test_step_server.py", "test_search_gpu_evaluator.py", "test_compile_stage.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable: a file's own order is kept


# The tests leave the checkout as they found them (issue 67: compiles left *.cubin files and a refused command an
# empty out/ in the repo root): the controlling process lists the root before and after, and a new entry, or a file
# written again, fails the run. Compiles anywhere in the session (probe subprocesses included) keep their dumps in a
# temporary folder: the DSL writes them to the working directory when CUTE_DSL_DUMP_DIR is unset.
_ROOT_BEFORE: dict = {}


def pytest_configure(config):
    os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.mkdtemp(prefix="fa4tune-test-dumps-"))
    if not hasattr(config, "workerinput"):
        _ROOT_BEFORE.update(_root_entries())


def _root_entries() -> dict:
    return {p.name: p.stat().st_mtime if p.is_file() else None for p in ROOT.iterdir()}


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):
        return
    left = sorted(name for name, mtime in _root_entries().items()
                  if name != ".pytest_cache" and (name not in _ROOT_BEFORE or _ROOT_BEFORE[name] != mtime))
    if left:
        session.config.get_terminal_writer().line(f"error: tests_left_files: the tests wrote {left} into {ROOT}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
