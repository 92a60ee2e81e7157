"""Upstream's own tests (flash-attention's tests/cute) against the pinned flash-attn-4, pristine and with each patch
of our upstream series applied in order (issue #43 item 2): the counts side by side and every test whose outcome
differs from the pristine run's, named with its message.

    git clone https://github.com/Dao-AILab/flash-attention /tmp/fa   # then check out the commit nearest the wheel
    FLASH_ATTENTION_ARCH=sm_120 FLASH_ATTENTION_NUM_SMS=132 \\
        python3 bench/upstream_tests.py --tests /tmp/fa/tests/cute [--sample 4] [-k EXPR] [--workers 8] [--out DIR]

Each variant is a copy of the installed flash_attn package (pristine, then + 0001, + 0001-0002, ...: `--series`),
patched with `git apply`, first on its pytest process's path. The test files the patches add (tests/cute/...) run in
every variant, pristine included: a fix's own test fails before it and passes after. Under FLASH_ATTENTION_ARCH=sm_120 a pytest plugin answers compute capability 12.0 to the test files'
own calls of torch.cuda.get_device_capability (their IS_SM120 branches), and nothing else: flash-attn-4 keeps the
real device's answer, so on a GPU that is not SM 12.0 its SM120 classes run emulated, as everywhere in fa4-tune.
After each test the plugin gives its process's cached GPU memory back to the driver (PyTorch's caching allocator
would keep the pool of the largest test the worker ran, out of the other workers' reach).

The two files hold 418,214 cases (2026-08 tests). First run every case that reaches a tuned entry of the series: its
parameters (d, causal, mha_type or qhead_per_kvhead, seqlen_q, local_enum, dtype) select, in the patched config.py, an
SM120 forward or backward entry other than the previous default. Then `--sample S` of the others: of each test
function with more than 16, a fixed pseudo-random S * log2(n) of its n cases (by the hash of their ids: the same
cases in every variant and every run; at least 16), and every case of the others; `--sample 0` runs all.

A call cut off by its time limit (a device call's 10 minutes) is continued by the next with `--resume` and the same
--out: each variant's cases that have their outcome in its report keep it and do not run again, the others run, then
the failures still to run again alone; the reports are appended to. Each variant's end prints how many of its
selected cases have no outcome yet and how many failures were not run again alone: an incomplete variant shows.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # fa4tune, when run as a script
SERIES = ROOT / "docs" / "measurements" / "data" / "2026-12-07-upstream-series-"
DEFAULT_FILES = ("test_flash_attn.py", "test_flash_attn_combine.py")
PLUGIN = "fa4tune_sm120_capability"
PLUGIN_SOURCE = '''"""Written by fa4-tune's bench/upstream_tests.py: compute capability 12.0 for the test files' own calls,
each phase's outcome in the report, the GPU memory a test leaves cached given back, finished cases deselected."""
import gc
import json
import os
import sys

import pytest

TESTS = tuple(p for p in os.environ.get("FA4TUNE_UPSTREAM_TESTS", "").split(os.pathsep) if p)
REPORT = os.environ.get("FA4TUNE_UPSTREAM_REPORT", "")
DONE = os.environ.get("FA4TUNE_UPSTREAM_DONE", "")
PARAMS = os.environ.get("FA4TUNE_UPSTREAM_PARAMS", "")
GPUS = [g for g in os.environ.get("FA4TUNE_UPSTREAM_GPUS", "").split(",") if g]
_controller = []
_sticky = []
_poisoned = []


def _poisons(message):
    """A CUDA error that leaves the process's context unusable (every later call fails): not an out-of-memory."""
    return "CUDA error" in message and "out of memory" not in message and "ALLOC_FAILED" not in message


def _message(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else (
        report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr or ""))
    lines = str(text or "").strip().splitlines()
    return lines[0][:200] if lines else ""


def pytest_runtest_logreport(report):
    """Each phase's outcome, appended as it lands (a run cut off by the timeout keeps what it finished). In an xdist
    worker, a CUDA error that poisons the process (not an out-of-memory) ends the worker after this test: xdist
    starts a fresh one, so one faulty kernel fails its own test, not every later test of the worker."""
    message = _message(report) if report.failed or report.skipped else ""
    if report.failed and _poisons(message):
        _poisoned.append(report.nodeid)
    if not _controller:
        if report.failed and _poisons(message):
            _sticky.append(report.nodeid)
        return
    if not REPORT:
        return
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "")
    with open(REPORT, "a") as stream:
        stream.write(json.dumps({"id": report.nodeid, "when": report.when, "outcome": report.outcome,
                                 "message": message, "worker": worker}) + "\\n")


def pytest_runtest_logfinish(nodeid, location):
    if _sticky:
        os._exit(3)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """After each test, its teardown reported (its fixtures' values and its failure's frames let go, here, not before:
    pytest holds them until then), the GPU memory PyTorch's caching allocator keeps for the process goes back to
    the driver: 8 workers each holding the pool of the largest test they ran starve the others (out of memory). Only
    where the test files imported torch and initialized CUDA (never imported here: nothing at all without torch),
    and never into a context a CUDA error poisoned (`_poisoned`; a worker so poisoned ends before this, `_sticky`).
    Nothing raised."""
    try:
        return (yield)
    finally:
        _release()


def _release():
    torch = sys.modules.get("torch")
    if torch is None or _poisoned:
        return
    try:
        if not torch.cuda.is_initialized():
            return
        for name in ("last_type", "last_value", "last_traceback", "last_exc"):  # pytest's copy of a failure, frames
            if getattr(sys, name, None) is not None:                            # and tensors with it
                setattr(sys, name, None)
        gc.collect()
        torch.cuda.empty_cache()
    except Exception:
        pass


def _plain(value):
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def pytest_collection_modifyitems(config, items):
    """Each case's parameters to PARAMS (a JSON line per case: its id and params) when set; --resume: the cases an
    earlier call finished (DONE, one id a line) are deselected, by their exact ids (pytest's --deselect takes
    prefixes: test_a would take test_ab with it)."""
    if PARAMS:
        with open(PARAMS, "w") as stream:
            for item in items:
                params = getattr(getattr(item, "callspec", None), "params", {})
                stream.write(json.dumps({"id": item.nodeid, "params": {k: _plain(v) for k, v in params.items()}}) + "\\n")
    if not DONE:
        return
    with open(DONE) as stream:
        done = set(stream.read().splitlines())
    if any(item.nodeid in done for item in items):
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in done])
        items[:] = [item for item in items if item.nodeid not in done]


def pytest_configure(config):
    worker = getattr(config, "workerinput", {}).get("workerid", "")
    if GPUS and worker:  # --gpus: worker gwN on the N-th GPU of the list, round robin, before anything starts CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = GPUS[int(worker[2:]) % len(GPUS)]
    if not hasattr(config, "workerinput"):  # xdist's controller (or a run without xdist) writes the report
        _controller.append(True)
        if getattr(config.option, "numprocesses", None):  # the tests run in the workers: no torch here
            return
    if os.environ.get("FLASH_ATTENTION_ARCH") != "sm_120" or not TESTS:
        return
    import torch

    real = torch.cuda.get_device_capability

    def get_device_capability(device=None):
        caller = sys._getframe(1).f_globals.get("__file__") or ""
        return (12, 0) if os.path.abspath(caller).startswith(TESTS) else real(device)

    torch.cuda.get_device_capability = get_device_capability
'''


@dataclasses.dataclass
class Outcome:
    """One variant's run: each test's outcome ('passed', 'failed', 'error', 'skipped') and message; the tests run
    again alone; of the `selected` cases (the @files' ids), those `missing` a final outcome (cut off), and the
    failures to run again alone that were not (`not_rerun`, cut off or no time left)."""

    variant: str
    tests: dict[str, tuple[str, str]]
    seconds: float
    returncode: int
    rerun: list[str] = dataclasses.field(default_factory=list)
    selected: int = 0
    missing: list[str] = dataclasses.field(default_factory=list)
    not_rerun: list[str] = dataclasses.field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(1 for o, _ in self.tests.values() if o == outcome)


def series_patches(prefix: Path = SERIES) -> list[Path]:
    """The series' patches in order (NNNN-*.patch)."""
    patches = sorted(prefix.parent.glob(prefix.name + "[0-9][0-9][0-9][0-9]-*.patch"))
    if not patches:
        raise SystemExit(f"upstream_tests: no patch matches {prefix}NNNN-*.patch (rule: --series names a patch series)")
    return patches


def installed_package() -> Path:
    """The installed flash_attn package's directory (not imported)."""
    spec = importlib.util.find_spec("flash_attn")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("upstream_tests: flash_attn is not installed (rule: the pinned flash-attn-4 wheel)")
    return Path(next(iter(spec.submodule_search_locations)))


def make_variant(site: Path, package: Path, patches: list[Path]) -> None:
    """A copy of the package under `site`, the patches applied in order; one error naming the patch that fails."""
    shutil.copytree(package, site / package.name, ignore=shutil.ignore_patterns("__pycache__"))
    for i, patch in enumerate(patches):
        done = subprocess.run(["git", "apply", "-p1", str(patch)], cwd=site, capture_output=True, text=True)
        if done.returncode:
            under = " + ".join(p.name for p in patches[:i]) or "the installed package"
            raise SystemExit(f"upstream_tests: {patch.name} does not apply on {under}: {done.stderr.strip()}")


def read_baseline(path: Path) -> dict[str, tuple[str, str]]:
    """An earlier call's variant report (a .jsonl) with the outcomes of its failures run again alone (the
    <variant>.rerun.jsonl beside it) over the first pass's, as that call counted them; {} if it holds none."""
    if path.suffix != ".jsonl" or not path.is_file():
        return {}
    tests = read_report(path)
    again = path.with_suffix(".rerun.jsonl")
    if tests and again.is_file():
        tests.update(read_report(again))
    return tests


def _rows(path: Path):
    """The plugin's per-phase lines of a report, in order; a torn last line (killed) is dropped."""
    for line in path.read_text().splitlines():
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


def read_report(path: Path) -> dict[str, tuple[str, str]]:
    """{test id: (outcome, message)} from the plugin's per-phase lines, as junit counts them: a failed call is
    'failed', a failed setup or teardown 'error', a skipped setup 'skipped', a passed call 'passed'. A torn last line (killed) is dropped.
    A case's setup line after earlier lines of it starts it afresh: --resume runs again, appending to the report,
    a case an earlier call left unfinished (see `finished`), and that run's outcome counts."""
    tests: dict[str, tuple[str, str]] = {}
    for row in _rows(path):
        test, outcome, when = row["id"], row["outcome"], row["when"]
        if when == "setup":
            tests.pop(test, None)
        if outcome == "failed":
            if tests.get(test, ("",))[0] != "failed":
                tests[test] = ("failed" if when == "call" else "error", row["message"])
        elif outcome == "skipped" or (when == "call" and test not in tests):  # a passed setup alone is no pass
            tests[test] = (outcome, row["message"] if outcome == "skipped" else "")
    return tests


def finished(path: Path) -> set[str]:
    """The cases whose last run in the report has its final outcome: its teardown line landed (pytest reports one for
    every case, after a failed or skipped setup too), or xdist's line for the worker that crashed under it (phase
    '???', the case's last). A case cut off before either has none, even with its call's outcome (its teardown may
    still fail): --resume runs it again."""
    done: set[str] = set()
    for row in _rows(path):
        if row["when"] == "setup":
            done.discard(row["id"])
        elif row["when"] in ("teardown", "???"):
            done.add(row["id"])
    return done


def _pytest(site: Path, tests_dir: Path, args: list[str], log: Path, timeout: float, report: Path | None = None,
            done: Path | None = None, append: bool = False, gpus: str = "", params: Path | None = None) -> int:
    """pytest in the tests directory with the variant first on the path and the capability plugin; its exit code
    (-1 past the timeout: the whole process group, xdist's workers with it, is killed), its output in `log` (after
    an earlier call's where `append`), each test's outcome in `report` as it lands, the cases listed in `done` (one
    id a line) deselected; `gpus` (comma-separated CUDA device indices): each xdist worker on one of them, round
    robin; `params`: each collected case's parameters written there. The plugin, pytest's cache and the series' added tests live beside `site` (the --work directory)."""
    work = site.parent
    plugin_dir = work / "plugin"
    plugin_dir.mkdir(exist_ok=True)
    (plugin_dir / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
    argv = [sys.executable, "-m", "pytest", "-p", PLUGIN, "-o", "cache_dir=" + str(work / ".pytest_cache"),
            "--rootdir", str(tests_dir), *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(plugin_dir), os.environ.get("PYTHONPATH", "")]),
               FA4TUNE_UPSTREAM_TESTS=os.pathsep.join([str(tests_dir.resolve()), str((work / "added-tests").resolve())]),
               FA4TUNE_UPSTREAM_REPORT=str(report.resolve()) if report else "",
               FA4TUNE_UPSTREAM_DONE=str(done.resolve()) if done else "", FA4TUNE_UPSTREAM_GPUS=gpus,
               FA4TUNE_UPSTREAM_PARAMS=str(params.resolve()) if params else "")
    with open(log, "a" if append else "w") as stream:
        process = subprocess.Popen(argv, cwd=tests_dir, env=env, stdout=stream, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return -1


def collect(site: Path, tests_dir: Path, files: list[str], k: str | None, out: Path, timeout: float) -> list[str]:
    """The node ids pytest collects from `files` (with -k), on the variant at `site`; their parameters in
    out/params.jsonl (read_params)."""
    log = out / "collect.log"
    code = _pytest(site, tests_dir, [*files, "--collect-only", "-q", *(["-k", k] if k else [])], log, timeout,
                   params=out / "params.jsonl")
    ids = [line for line in log.read_text().splitlines() if "::" in line and not line.startswith(" ")]
    if code not in (0, 5):  # 5: nothing collected (-k left nothing of the upstream files: the patches' tests may run)
        raise SystemExit(f"upstream_tests: collecting {', '.join(files)} failed (exit {code}); see {log}")
    return ids


def sample(ids: list[str], scale: float) -> list[str]:
    """Of each test function with more than 16 cases, max(16, scale * log2(n)) of its n cases, chosen by the hash
    of their ids; every case of the others; scale 0: every id. Order kept."""
    if scale <= 0:
        return list(ids)
    groups: dict[str, list[str]] = {}
    for node in ids:
        groups.setdefault(node.split("[")[0], []).append(node)
    chosen = set()
    for group in groups.values():
        keep = len(group) if len(group) <= 16 else min(len(group), max(16, round(scale * math.log2(len(group)))))
        chosen.update(sorted(group, key=lambda n: hashlib.sha1(n.encode()).hexdigest())[:keep])
    return [n for n in ids if n in chosen]


def read_params(path: Path) -> dict[str, dict]:
    """{case id: its parameters} as collect wrote them (a missing file: none)."""
    if not path.is_file():
        return {}
    return {row["id"]: row["params"] for row in map(json.loads, path.read_text().splitlines())}


# Upstream's parameter names for what the SM120 tables key on. mha_type: test_flash_attn_output's and
# test_flash_attn_varlen_output's query heads per KV head (6 query heads; gqa 3 KV heads, mqa 1).
HEAD_DIM = ("d", "head_dim", "headdim")
MHA_TYPES = {"mha": 1, "gqa": 2, "mqa": 6}
PREFILL_SEQLEN = 1024  # a case without a query length: a prefill


def case_shape(params: dict) -> dict | None:
    """The shape a case runs (head_dim, causal, qhead_per_kvhead, seqlens, local, dtype), or None where its parameters
    do not say its head dim and causality."""
    d = next((params[n] for n in HEAD_DIM if isinstance(params.get(n), int)), None)
    if d is None or not isinstance(params.get("causal"), bool):
        return None
    ratio = params.get("qhead_per_kvhead", MHA_TYPES.get(params.get("mha_type", "mha")))
    if not isinstance(ratio, int):
        return None
    seqlen_q = params.get("seqlen_q") if isinstance(params.get("seqlen_q"), int) else PREFILL_SEQLEN
    seqlen_k = params.get("seqlen_k") if isinstance(params.get("seqlen_k"), int) else seqlen_q
    local = bool(params.get("local_enum", 0)) or params.get("local") is True
    dtype = params.get("dtype", "torch.bfloat16")
    return dict(head_dim=d, head_dim_v=params.get("dv") if isinstance(params.get("dv"), int) else d,
                causal=params["causal"], qhead_per_kvhead=ratio, seqlen_q=max(seqlen_q, 1), seqlen_k=max(seqlen_k, 1),
                local=local, dtype=dtype if dtype.startswith("torch.") else "torch.bfloat16")


def load_config(site: Path):
    """The variant's flash_attn/cute/config.py, loaded alone (it imports the standard library only)."""
    from fa4tune.upstream import load_config as load_alone

    return load_alone(site / "flash_attn" / "cute" / "config.py", "upstream_tests_config")


def reaches_tuned_entry(config, shape: dict) -> bool:
    """Whether the series' SM120 tables (the patched `config` module's) choose an entry of their own for the shape,
    forward or backward: one that differs from what they choose for the same shape with a local window, which
    every table leaves to the previous defaults."""
    if shape["local"]:
        return False
    nheads_kv = 2
    common = dict(device_arch=120, head_dim=shape["head_dim"], head_dim_v=shape["head_dim_v"], dtype=shape["dtype"],
                  num_heads=nheads_kv * shape["qhead_per_kvhead"], num_heads_kv=nheads_kv, causal=shape["causal"])
    fwd = config.FwdHeuristicInputs(**common, num_sms=170, batch_size=1, total_q=shape["seqlen_q"],
                                    total_k=shape["seqlen_k"], max_seqlen_q=shape["seqlen_q"], max_seqlen_k=shape["seqlen_k"])
    bwd = config.BwdHeuristicInputs(**common, max_seqlen_q=shape["seqlen_q"], max_seqlen_k=shape["seqlen_k"])
    tuned = False
    if hasattr(config, "select_sm120_fwd_tile"):
        tuned |= config.select_sm120_fwd_tile(fwd) != config.select_sm120_fwd_tile(fwd._replace(local=True))
    if hasattr(config, "sm120_bwd_fields"):
        tuned |= config.sm120_bwd_fields(bwd) != config.sm120_bwd_fields(bwd._replace(local=True))
    return tuned


def prioritized(ids: list[str], params: dict[str, dict], config, scale: float) -> tuple[list[str], int]:
    """Every case that reaches a tuned entry of the series (in collection order), then `sample` of the others; and how
    many came first."""
    def tuned(node: str) -> bool:
        shape = case_shape(params.get(node, {}))
        return shape is not None and reaches_tuned_entry(config, shape)

    first = [n for n in ids if tuned(n)]
    chosen = set(first)
    return first + sample([n for n in ids if n not in chosen], scale), len(first)


# failed for want of the GPU memory the workers share, with a CUDA error (the test's own, or one a kernel before it left),
# or with their worker: run again alone
RERUN = ("out of memory", "ALLOC_FAILED", "CUDA error", "crashed")


def run_variant(name: str, site: Path, tests_dir: Path, targets: list[str], added: list[Path], k: str | None,
                workers: int, out: Path, timeout: float, resume: bool = False, gpus: str = "") -> Outcome:
    """pytest on the variant: the targets (files or an @file of node ids) and the test files the patches add, with -k
    where given, over `workers` xdist processes (a worker ended by a sticky CUDA error is replaced). Then, in the time
    left, the tests that failed for want of GPU memory or with their worker run again one at a time, in one process:
    their second outcome counts, and Outcome.rerun names them.

    `resume`: the variant's reports in `out` from an earlier call, cut off, are continued, not restarted (appended
    to). The cases with a final outcome there (`finished`) keep it and do not run again: the @files' ids without
    one run (an @file of them, <variant>.resume.txt), and of the files passed whole (the patches' tests) the cases
    not in <variant>.done.txt (the finished ids, deselected by the plugin); then the failures to run again alone that
    the earlier rerun report has not finished; the logs appended to as well. The outcomes merge (a rerun's overrides the first pass's); the exit
    code is the one a pass over every case would have given (1 where one failed) unless this call's was cut off."""
    if not targets and not added:  # nothing selected (bare pytest would run the whole directory)
        return Outcome(name, {}, 0.0, 5)
    started = time.perf_counter()
    stem = _file_name(name)
    report, rerun = out / f"{stem}.jsonl", out / f"{stem}.rerun.jsonl"
    selected = [i for t in targets if t.startswith("@") for i in Path(t[1:]).read_text().splitlines() if i]
    earlier = resume and report.exists()
    done = None
    if earlier:
        ended = finished(report)
        done = out / f"{stem}.done.txt"
        done.write_text("".join(f"{i}\n" for i in sorted(ended)))
        remaining = out / f"{stem}.resume.txt"
        remaining.write_text("".join(f"{i}\n" for i in selected if i not in ended))
        whole = [t for t in targets if not t.startswith("@")]
        targets = (["@" + str(remaining.resolve())] if remaining.read_text() else []) + whole
    elif not resume:
        report.unlink(missing_ok=True)
    args = [*targets, *(str(p) for p in added), "-q", "-rN", *(["-k", k] if k else [])]
    if workers > 1:  # one process alone needs no xdist (nor its restart of a poisoned worker: nothing runs after)
        args += ["-n", str(workers), "--max-worker-restart", "100000"]
    code = 0  # every case finished earlier: no pass
    if targets or added:
        code = _pytest(site, tests_dir, args, out / f"{stem}.log", timeout, report, done, resume, gpus)
    tests = read_report(report) if report.exists() else {}
    ended = finished(report) if report.exists() else set()
    if earlier and code in (0, 1, 5):
        code = 1 if any(o in ("failed", "error") for o, _ in tests.values()) else 0 if tests else 5
    again = sorted(t for t, (o, m) in tests.items() if o in ("failed", "error") and any(r in m for r in RERUN))
    rerun_done = finished(rerun) if resume and rerun.exists() else set()
    todo = [t for t in again if t not in rerun_done]
    left = timeout - (time.perf_counter() - started)
    ran = bool(todo and workers > 1 and left > 10 and code != -1)
    if ran:
        ids = out / f"{stem}.rerun.txt"
        ids.write_text("".join(f"{i}\n" for i in todo))
        if not resume:
            rerun.unlink(missing_ok=True)
        args = ["@" + str(ids.resolve()), "-q", "-rN", "-n", "1", "--max-worker-restart", "100000"]
        code_again = _pytest(site, tests_dir, args, out / f"{stem}.rerun.log", left, rerun, append=resume, gpus=gpus)
        code = -1 if code_again == -1 else code
    if (ran or resume) and rerun.exists():
        tests.update(read_report(rerun))
        rerun_done = finished(rerun)
    return Outcome(name, tests, time.perf_counter() - started, code,
                   again if ran else [t for t in again if t in rerun_done], len(selected),
                   [i for i in selected if i not in ended],
                   [t for t in again if t not in rerun_done] if workers > 1 else [])


def _file_name(variant: str) -> str:
    """A variant's file name: 'pristine', 'p0001', 'p0001-0002', ... (no '+', which the device's copy-back refuses)."""
    return variant if variant == "pristine" else "p" + variant.lstrip("+").replace("+", "-")


def added_tests(package: Path, patches: list[Path], work: Path) -> list[Path]:
    """The test files the whole series adds under tests/cute, copied to work/added-tests."""
    site, added = work / "site-all", work / "added-tests"
    for path in (site, added):
        shutil.rmtree(path, ignore_errors=True)
    site.mkdir()
    make_variant(site, package, patches)
    found = sorted((site / "tests" / "cute").glob("test_*.py")) if (site / "tests" / "cute").is_dir() else []
    if found:
        added.mkdir()
    copies = [Path(shutil.copy(path, added / path.name)) for path in found]
    shutil.rmtree(site)
    return copies


def differences(base: Outcome, other: Outcome) -> list[str]:
    """One line per test whose outcome differs from the base run's (or that only one of them ran)."""
    lines = []
    for test in sorted(set(base.tests) | set(other.tests)):
        a, b = base.tests.get(test, ("not run", "")), other.tests.get(test, ("not run", ""))
        if a[0] != b[0]:
            lines.append(f"{test}: {a[0]} -> {b[0]}" + (f" ({b[1]})" if b[1] else ""))
    return lines


def report(outcomes: list[Outcome]) -> list[str]:
    """The markdown table and the differences from the pristine run."""
    lines = ["| variant | passed | failed | errors | skipped | run again alone | pytest exit | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| {o.variant} | {o.count('passed')} | {o.count('failed')} | {o.count('error')} | "
                     f"{o.count('skipped')} | {len(o.rerun)} | {o.returncode if o.returncode >= 0 else 'timeout'} | "
                     f"{o.seconds:.0f} |")
    for o in outcomes[1:]:
        diff = differences(outcomes[0], o)
        lines += ["", f"{o.variant} vs {outcomes[0].variant}: {len(diff)} test(s) differ"] + [f"  {d}" for d in diff]
    failed = [f"  {t}: {m}" for t, (res, m) in sorted(outcomes[0].tests.items()) if res in ("failed", "error")]
    if failed:
        lines += ["", f"{outcomes[0].variant}: failing tests"] + failed
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=Path, required=True, help="flash-attention's tests/cute directory")
    parser.add_argument("--files", default=",".join(DEFAULT_FILES), help="comma-separated test files in --tests")
    parser.add_argument("-k", dest="k", default=None, help="pytest -k expression selecting the cases")
    parser.add_argument("--sample", type=float, default=4, help="cases per test function: S * log2(n), 0 for all")
    parser.add_argument("--series", type=Path, default=SERIES, help="the patch series' path prefix")
    parser.add_argument("--variants", default="", help="comma-separated indices to run (0 pristine, 1 + the first "
                        "patch, ...; default all), for a device call's time limit")
    parser.add_argument("--baseline", type=Path, default=None, help="an earlier call's pristine.jsonl to compare with (its "
                        "pristine.rerun.jsonl beside it counts too)")
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist processes (compiles run in parallel)")
    parser.add_argument("--timeout", type=float, default=3000, help="seconds per variant")
    parser.add_argument("--gpus", default="", help="comma-separated CUDA device indices (physical: each worker's "
                        "CUDA_VISIBLE_DEVICES is set to one of them): the xdist workers take one each, round robin "
                        "(default: the devices the process sees, every worker on the first)")
    parser.add_argument("--out", type=Path, default=Path("out/upstream-tests"), help="reports, logs, selected.txt")
    parser.add_argument("--resume", action="store_true", help="continue the variants an earlier call, cut off, left "
                        "in --out (its selected.txt, each variant's reports): the cases it finished keep their "
                        "outcome and do not run again")
    parser.add_argument("--work", type=Path, default=None, help="the variants' packages, pytest's plugin and cache "
                        "(default: --out; elsewhere keeps --out small, e.g. for a device call's $OUT)")
    args = parser.parse_args(argv)
    if args.gpus and not all(g.isdigit() for g in args.gpus.split(",")):
        raise SystemExit(f"upstream_tests: --gpus {args.gpus}: comma-separated CUDA device indices, e.g. 0,1 (rule: "
                         "one index a GPU)")
    files = [f for f in args.files.split(",") if f]
    missing = [f for f in files if not (args.tests / f).is_file()]
    if missing:
        raise SystemExit(f"upstream_tests: {', '.join(missing)} not in {args.tests} (rule: --tests is tests/cute)")
    baseline = {}
    if args.baseline is not None:
        baseline = read_baseline(args.baseline)
        if not baseline:
            raise SystemExit(f"upstream_tests: --baseline {args.baseline}: no test outcomes in it (rule: an earlier "
                             "call's pristine.jsonl)")
    patches = series_patches(args.series)
    package = installed_package()
    wanted = [int(v) for v in args.variants.split(",") if v] or list(range(len(patches) + 1))
    if any(not 0 <= v <= len(patches) for v in wanted):
        raise SystemExit(f"upstream_tests: --variants {args.variants}: indices run from 0 (pristine) to {len(patches)}")
    args.out.mkdir(parents=True, exist_ok=True)  # only once the arguments hold: a refusal writes nothing
    work = args.work or args.out
    work.mkdir(parents=True, exist_ok=True)
    tests_dir = args.tests.resolve()
    added = added_tests(package, patches, work)
    outcomes, targets = [], None
    if args.baseline is not None:  # the pristine run of an earlier call: its cases, so the same ones run here
        outcomes.append(Outcome("pristine (earlier call)", baseline, 0.0, 0))
        selected = args.baseline.with_name("selected.txt")
        if selected.is_file():
            targets = ["@" + str(selected.resolve())] if selected.read_text().strip() else []
    chosen = args.out / "selected.txt"
    if args.resume and targets is None and chosen.is_file():  # the earlier call's cases, not collected again
        targets = ["@" + str(chosen.resolve())] if chosen.read_text().strip() else []
        print(f"resuming: {len(chosen.read_text().split())} cases selected by the earlier call: {chosen}", flush=True)
    series_config = None
    if targets is None:  # the tables of the whole series decide which cases go first
        series_site = work / "site-series"
        shutil.rmtree(series_site, ignore_errors=True)
        series_site.mkdir()
        make_variant(series_site, package, patches)
        series_config = load_config(series_site)
    for n in wanted:
        name = "pristine" if n == 0 else "+" + "+".join(p.name[len(args.series.name):][:4] for p in patches[:n])
        site = work / f"site-{n}"
        shutil.rmtree(site, ignore_errors=True)
        site.mkdir()
        make_variant(site, package, patches[:n])
        if targets is None:  # chosen on the first variant run, the same for all (the upstream files are not patched)
            collected = collect(site, tests_dir, files, args.k, args.out, args.timeout)
            ids, first = prioritized(collected, read_params(args.out / "params.jsonl"), series_config, args.sample)
            (args.out / "selected.txt").write_text("".join(f"{i}\n" for i in ids))
            targets = ["@" + str((args.out / "selected.txt").resolve())] if ids else []
            print(f"{len(ids)} cases selected: first the {first} that reach a tuned entry of the series, then "
                  f"--sample {args.sample:g} of the others: {args.out / 'selected.txt'}", flush=True)
        outcome = run_variant(name, site, tests_dir, targets, added, args.k, args.workers, args.out, args.timeout,
                              args.resume, args.gpus)
        outcomes.append(outcome)
        print(f"{name}: {outcome.count('passed')} passed, {outcome.count('failed')} failed, "
              f"{outcome.count('error')} errors, {outcome.count('skipped')} skipped in {outcome.seconds:.0f} s", flush=True)
        print(f"{name}: {len(outcome.missing)} of {outcome.selected} selected cases without an outcome (cut off), "
              f"{len(outcome.not_rerun)} failures to run again alone not run"
              + (": incomplete, --resume continues it" if outcome.missing or outcome.not_rerun else ""), flush=True)
    print("\n".join(report(outcomes)))
    # 1 where a variant's pytest did not finish its run: past --timeout (-1), interrupted (2), internal or usage error
    return 1 if any(o.returncode in (-1, 2, 3, 4) for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
