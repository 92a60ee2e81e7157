"""bench/upstream_tests.py on the CPU: a patch series applied to copies of the installed flash-attn-4 (a one-patch
stand-in here; that the shipped series applies in order is tests/test_search_export_series.py's), a stand-in for
upstream's tests run against each (the SM120 capability answered to test files only), the outcomes read back from
the per-test report written as each test lands and every difference from the pristine run named."""

import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import upstream_tests  # noqa: E402

PATCH = """--- /dev/null
+++ b/flash_attn/cute/fa4tune_marker.py
@@ -0,0 +1 @@
+MARKER = True
--- /dev/null
+++ b/tests/cute/test_added_by_patch.py
@@ -0,0 +1,6 @@
+import importlib.util
+from pathlib import Path
+
+
+def test_added_by_patch():  # a fix's own test: fails before the patch, passes after
+    assert (Path(next(iter(importlib.util.find_spec("flash_attn").submodule_search_locations))) / "cute" / "fa4tune_marker.py").is_file()
"""

STAND_IN = '''
import importlib.util
from pathlib import Path

import pytest
import torch

IS_SM120 = torch.cuda.get_device_capability()[0] == 12  # as upstream's test files ask


def _package():
    return Path(next(iter(importlib.util.find_spec("flash_attn").submodule_search_locations)))


def test_the_test_files_see_sm120():
    assert IS_SM120


def test_the_patched_file_is_there():  # added by the stand-in series' patch
    assert (_package() / "cute" / "fa4tune_marker.py").is_file()


def test_skipped():
    pytest.skip("as upstream skips a case")
'''


def _stand_in(tmp_path, name: str, source: str):
    """flash-attention's tests/cute with one test file, and the one-patch stand-in series: (tests dir, series prefix)."""
    tests = tmp_path / "fa" / "tests" / "cute"
    tests.mkdir(parents=True)
    (tests / name).write_text(source)
    series = tmp_path / "series"
    series.mkdir()
    (series / "2026-12-05-upstream-series-0001-marker.patch").write_text(PATCH)
    return tests, series / "2026-12-05-upstream-series-"


def test_each_variant_runs_the_tests_on_its_patched_copy_and_the_differences_are_named(tmp_path, monkeypatch):
    tests, prefix = _stand_in(tmp_path, "test_stand_in.py", STAND_IN)
    monkeypatch.setenv("FLASH_ATTENTION_ARCH", "sm_120")
    out = tmp_path / "out"
    code = upstream_tests.main(["--tests", str(tests), "--files", "test_stand_in.py", "--series",
                                str(prefix), "--out", str(out)])
    assert code == 0
    table = (out / "pristine.jsonl").read_text()
    assert "test_the_patched_file_is_there" in table
    outcomes = {o: upstream_tests.read_report(out / f"{f}.jsonl") for o, f in (("pristine", "pristine"), ("+0001", "p0001"))}
    by_name = {o: {t.split("::")[-1]: r[0] for t, r in tests_.items()} for o, tests_ in outcomes.items()}
    assert by_name["pristine"] == {"test_the_test_files_see_sm120": "passed", "test_the_patched_file_is_there": "failed",
                                   "test_skipped": "skipped", "test_added_by_patch": "failed"}  # the patch's test, before it
    assert by_name["+0001"] == {**by_name["pristine"], "test_the_patched_file_is_there": "passed", "test_added_by_patch": "passed"}
    runs = [upstream_tests.Outcome(o, t, 1.0, 0) for o, t in outcomes.items()]
    lines = upstream_tests.report(runs)
    assert lines[2] == "| pristine | 1 | 2 | 0 | 1 | 0 | 0 | 1 |"
    assert "+0001 vs pristine: 2 test(s) differ" in lines
    assert any("test_added_by_patch: failed -> passed" in line for line in lines)
    assert any("test_the_patched_file_is_there: failed -> passed" in line for line in lines)
    # a later call (a device call's time limit): one variant against the first call's pristine run, the same cases
    # (its packages and pytest's files in --work, so that --out holds only reports and logs)
    later, work = tmp_path / "later", tmp_path / "work"
    assert upstream_tests.main(["--tests", str(tests), "--files", "test_stand_in.py", "--series",
                                str(prefix), "--out", str(later), "--variants", "1",
                                "--baseline", str(out / "pristine.jsonl"), "--work", str(work)]) == 0
    assert not (later / "selected.txt").exists() and not (later / "pristine.jsonl").exists()
    assert {p.name for p in later.iterdir()} == {"p0001.jsonl", "p0001.log"}
    assert {"site-1", "plugin"} <= {p.name for p in work.iterdir()}
    assert upstream_tests.read_report(later / "p0001.jsonl") == outcomes["+0001"]
    # -k that leaves none of upstream's cases: only the patch's own test runs, before and after the patch (here a
    # file without torch and no SM120 emulation asked: pytest processes of a second each)
    monkeypatch.delenv("FLASH_ATTENTION_ARCH")
    (tests / "test_plain.py").write_text("def test_plain():\n    pass\n")
    only = tmp_path / "only"
    assert upstream_tests.main(["--tests", str(tests), "--files", "test_plain.py", "--series",
                                str(prefix), "--out", str(only), "-k", "added_by_patch"]) == 0
    assert [{t.split("::")[-1]: r[0] for t, r in upstream_tests.read_report(only / f"{o}.jsonl").items()}
            for o in ("pristine", "p0001")] == [{"test_added_by_patch": "failed"}, {"test_added_by_patch": "passed"}]


def test_a_variant_cut_off_by_its_timeout_keeps_the_tests_it_finished(tmp_path):
    """A device call's limit: pytest and its xdist workers are killed at --timeout, and what landed before counts."""
    tests, prefix = _stand_in(tmp_path, "test_plain.py", "import time\n\ndef test_a_fast_one():\n    pass\n\n"
                                                         "def test_a_hung_one():\n    time.sleep(600)\n")
    out = tmp_path / "out"
    started = time.monotonic()
    code = upstream_tests.main(["--tests", str(tests), "--files", "test_plain.py", "--series",
                                str(prefix), "--out", str(out), "--variants", "0",
                                "--workers", "2", "--timeout", "10"])
    assert code == 1 and time.monotonic() - started < 40  # not the hung test's 600 s
    found = {t.split("::")[-1]: r[0] for t, r in upstream_tests.read_report(out / "pristine.jsonl").items()}
    assert found == {"test_a_fast_one": "passed", "test_added_by_patch": "failed"}


POISONING = '''
from pathlib import Path

import pytest

POISONED = []  # as a CUDA context after a misaligned address: every later launch in the process fails


def _launch(bad=False):
    if POISONED or bad:
        POISONED.append(True)
        raise RuntimeError("CUDA error: misaligned address")


def test_a_faulty_kernel():
    _launch(bad=True)


@pytest.mark.parametrize("i", range(8))
def test_a_sound_kernel(i):
    _launch()


def test_out_of_memory_while_the_others_hold_the_gpu():
    marker = Path(__file__).with_name("first-try")
    if not marker.exists():
        marker.touch()
        raise RuntimeError("CUDA out of memory. Tried to allocate 10.39 GiB")
'''


def test_a_sticky_cuda_error_fails_its_own_test_only_and_the_failures_run_again_alone(tmp_path):
    tests, prefix = _stand_in(tmp_path, "test_poisoning.py", POISONING)
    out = tmp_path / "out"
    assert upstream_tests.main(["--tests", str(tests), "--files", "test_poisoning.py", "--series",
                                str(prefix), "--out", str(out), "--variants", "0",
                                "--workers", "2", "-k", "not added_by_patch"]) == 0
    found = {t.split("::")[-1]: r for t, r in upstream_tests.read_report(out / "pristine.jsonl").items()}
    assert sum(r[0] == "passed" for t, r in found.items() if t.startswith("test_a_sound_kernel")) == 8
    assert found["test_a_faulty_kernel"] == ("failed", "RuntimeError: CUDA error: misaligned address")
    rerun = (out / "pristine.rerun.txt").read_text().split()
    assert [t.split("::")[-1] for t in rerun] == ["test_a_faulty_kernel", "test_out_of_memory_while_the_others_hold_the_gpu"]
    again = upstream_tests.read_report(out / "pristine.rerun.jsonl")
    assert [r[0] for r in again.values()] == ["failed", "passed"]  # the fault is the kernel's own; the memory was not


def test_bad_input_gets_one_error_naming_the_rule(tmp_path, monkeypatch):
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # where --out's default lies
    with pytest.raises(SystemExit, match=r"test_flash_attn.py, test_flash_attn_combine.py not in .* \(rule: --tests is tests/cute\)"):
        upstream_tests.main(["--tests", str(tmp_path)])
    (tmp_path / "t.py").write_text("")
    with pytest.raises(SystemExit, match=r"no patch matches .*nothing-NNNN-\*\.patch \(rule: --series"):
        upstream_tests.main(["--tests", str(tmp_path), "--files", "t.py", "--series", str(tmp_path / "nothing-")])
    (tmp_path / "old-0001-x.patch").write_text("")
    (tmp_path / "pristine.xml").write_text("<testsuites/>")
    with pytest.raises(SystemExit, match=r"--baseline .*pristine.xml: no test outcomes in it \(rule: an earlier call's pristine.jsonl\)"):
        upstream_tests.main(["--tests", str(tmp_path), "--files", "t.py", "--series", str(tmp_path / "old-"),
                             "--baseline", str(tmp_path / "pristine.xml"), "--out", str(tmp_path / "out0")])
    (tmp_path / "bad-0001-x.patch").write_text("--- a/nowhere.py\n+++ b/nowhere.py\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(SystemExit, match=r"bad-0001-x.patch does not apply on the installed package: "):
        upstream_tests.main(["--tests", str(tmp_path), "--files", "t.py", "--series", str(tmp_path / "bad-"),
                             "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=r"--variants 0,4: indices run from 0 \(pristine\) to 3"):
        upstream_tests.main(["--tests", str(tmp_path), "--files", "t.py", "--variants", "0,4"])  # the shipped three
    assert list((tmp_path / "cwd").iterdir()) == []  # a refusal writes nothing (no out/ where it was called)


def test_the_sample_keeps_small_functions_whole_and_takes_a_fixed_share_of_large_ones():
    ids = [f"t.py::big[{i}]" for i in range(1024)] + [f"t.py::small[{i}]" for i in range(5)] + ["t.py::one"]
    chosen = upstream_tests.sample(ids, 4)
    assert [n for n in chosen if "small" in n or "one" in n] == ids[1024:]
    big = [n for n in chosen if "big" in n]
    assert len(big) == 40 and big == sorted(big, key=ids.index)  # 4 * log2(1024), in collection order
    assert upstream_tests.sample(ids, 4) == chosen and upstream_tests.sample(ids, 0) == ids


FAKE_TORCH = '''
import gc
import sys
import types
from pathlib import Path

import pytest

EVENTS = Path(__file__).with_name("events")
gc.disable()  # a cycle goes only when the plugin collects: its line shows where
CUDA = []


def _event(text):
    with open(EVENTS, "a") as stream:
        stream.write(text + "\\n")


def _empty_cache():
    _event("empty_cache")
    raise RuntimeError("the stand-in driver refuses")  # the plugin swallows it: the test's outcome stands


sys.modules["torch"] = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: bool(CUDA),
                                                                        empty_cache=_empty_cache))


class Cycle:
    def __init__(self):
        self.me = self

    def __del__(self):
        _event("cycle collected")


@pytest.fixture
def tensors():
    yield Cycle()
    _event("fixture teardown")


def test_before_cuda():
    _event("test_before_cuda")


def test_one(tensors):
    CUDA.append(True)
    _event("test_one")


def test_out_of_memory():
    _event("test_out_of_memory")
    held = Cycle()  # noqa: F841 (a tensor the failure's frame holds)
    raise RuntimeError("CUDA error: out of memory")


def test_poisoning():
    _event("test_poisoning")
    raise RuntimeError("CUDA error: misaligned address")


def test_after():
    _event("test_after")
'''


def test_the_plugin_gives_back_the_cached_gpu_memory_after_each_test_and_never_into_a_poisoned_context(tmp_path,
                                                                                                      monkeypatch):
    """A stand-in torch: after each test's teardown (its fixtures' values and its failure's frames gone), a collection
    and then empty_cache, once CUDA is initialized; an out-of-memory leaves the context usable, a sticky CUDA error
    does not (no call into it after)."""
    monkeypatch.delenv("FLASH_ATTENTION_ARCH", raising=False)
    tests, prefix = _stand_in(tmp_path, "test_fake_torch.py", FAKE_TORCH)
    out = tmp_path / "out"
    assert upstream_tests.main(["--tests", str(tests), "--files", "test_fake_torch.py", "--series", str(prefix),
                                "--out", str(out), "--variants", "0", "-k", "not added_by_patch"]) == 0
    assert (tests / "events").read_text().split("\n")[:-1] == [
        "test_before_cuda",  # CUDA not initialized: nothing cached
        "test_one", "fixture teardown", "cycle collected", "empty_cache",
        "test_out_of_memory", "cycle collected", "empty_cache",
        "test_poisoning", "test_after"]
    found = {t.split("::")[-1]: r[0] for t, r in upstream_tests.read_report(out / "pristine.jsonl").items()}
    assert found == {"test_before_cuda": "passed", "test_one": "passed", "test_out_of_memory": "failed",
                     "test_poisoning": "failed", "test_after": "passed"}


NO_TORCH = '''
import sys

import pytest


@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("a fixture's teardown fails")


def test_first():
    pass


def test_torch_is_never_imported(request):  # after test_first's end: the plugin's hook ran
    plugin = sys.modules["fa4tune_sm120_capability"]
    hooks = request.config.hook.pytest_runtest_protocol.get_hookimpls()
    assert any(hook.plugin is plugin and hook.wrapper for hook in hooks)
    assert "torch" not in sys.modules


def test_teardown_error(broken_teardown):
    pass


def test_skipped():
    pytest.skip("as upstream skips a case")
'''


def test_the_memory_release_is_harmless_without_torch(tmp_path, monkeypatch):
    """Test files without torch through the plugin (one process: the cases in order): its hook after each test is
    there, imports nothing, and every outcome (a teardown's error included) lands in the report as before."""
    monkeypatch.delenv("FLASH_ATTENTION_ARCH", raising=False)
    tests, prefix = _stand_in(tmp_path, "test_no_torch.py", NO_TORCH)
    out = tmp_path / "out"
    assert upstream_tests.main(["--tests", str(tests), "--files", "test_no_torch.py", "--series", str(prefix),
                                "--out", str(out), "--variants", "0", "-k", "not added_by_patch"]) == 0
    found = {t.split("::")[-1]: r for t, r in upstream_tests.read_report(out / "pristine.jsonl").items()}
    assert found == {"test_first": ("passed", ""), "test_torch_is_never_imported": ("passed", ""),
                     "test_teardown_error": ("error", "RuntimeError: a fixture's teardown fails"),
                     "test_skipped": ("skipped", "Skipped: as upstream skips a case")}


def _rows(path: Path, rows: list[tuple[str, str, str, str]]) -> None:
    """A report as the plugin writes it: (id, phase, outcome, message) a line."""
    path.write_text("".join(json.dumps({"id": i, "when": w, "outcome": o, "message": m, "worker": ""}) + "\n"
                            for i, w, o, m in rows))


def test_a_case_has_its_final_outcome_once_its_teardown_or_its_worker_crash_is_reported(tmp_path):
    path = tmp_path / "pristine.jsonl"
    _rows(path, [("t.py::a", "setup", "passed", ""), ("t.py::a", "call", "failed", "AssertionError"),  # killed then
                 ("t.py::b", "setup", "passed", ""), ("t.py::b", "call", "failed", "CUDA error: out of memory"),
                 ("t.py::b", "teardown", "passed", ""),
                 ("t.py::c", "setup", "skipped", "Skipped: no"), ("t.py::c", "teardown", "passed", ""),
                 ("t.py::d", "setup", "passed", ""), ("t.py::d", "???", "failed", "worker 'gw0' crashed while running"),
                 ("t.py::e", "setup", "passed", ""),  # killed in its call
                 # --resume ran a again: its new run's outcome counts, not the earlier call's
                 ("t.py::a", "setup", "passed", ""), ("t.py::a", "call", "passed", ""),
                 ("t.py::a", "teardown", "passed", "")])
    with open(path, "a") as stream:
        stream.write('{"id": "t.py::f", "wh')  # torn by the kill
    assert upstream_tests.finished(path) == {"t.py::a", "t.py::b", "t.py::c", "t.py::d"}
    assert upstream_tests.read_report(path) == {"t.py::b": ("failed", "CUDA error: out of memory"),
                                                "t.py::c": ("skipped", "Skipped: no"),
                                                "t.py::d": ("error", "worker 'gw0' crashed while running"),
                                                "t.py::a": ("passed", "")}
    _rows(path, [("t.py::a", "setup", "passed", ""), ("t.py::a", "call", "passed", "")])
    assert upstream_tests.read_report(path) == {"t.py::a": ("passed", "")} and upstream_tests.finished(path) == set()


# the stand-in test files' head: each test appends its id to the file `ran` beside them (which ids a call ran)
RAN = '''
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def _ran(request):
    with open(HERE / "ran", "a") as stream:
        stream.write(request.node.nodeid + "\\n")

'''

RESUMED = RAN + '''

def test_crowded_out():  # fails for want of the GPU memory the other workers hold, while they do
    if (HERE / "crowded").exists():
        raise RuntimeError("CUDA error: out of memory")


@pytest.mark.parametrize("i", range(3))
def test_early(i):
    pass


def test_hung_until_released():
    deadline = time.monotonic() + 120
    while not (HERE / "released").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("i", range(3))
def test_late(i):
    pass
'''


def _ran(tests: Path) -> list[str]:
    """The ids the stand-in's tests ran since the last call (the side-effect file, emptied)."""
    path = tests / "ran"
    ids = sorted(path.read_text().split()) if path.exists() else []
    path.unlink(missing_ok=True)
    return ids


def test_resume_runs_only_the_cases_a_cut_off_call_left_then_its_failures_alone(tmp_path, monkeypatch, capsys):
    """A first call cut off by its timeout in a hung case; --resume keeps what it finished (not run again), runs the
    cases it left, the patch's test included, then alone the out-of-memory failure it never got to run again; a
    third --resume finds nothing left to run."""
    monkeypatch.delenv("FLASH_ATTENTION_ARCH", raising=False)
    tests, prefix = _stand_in(tmp_path, "test_resumed.py", RESUMED)
    (tests / "crowded").touch()
    out = tmp_path / "out"
    argv = ["--tests", str(tests), "--files", "test_resumed.py", "--series", str(prefix), "--out", str(out),
            "--variants", "0"]
    assert upstream_tests.main([*argv, "--timeout", "8"]) == 1  # one process: the cases in order, cut at the hung one
    ids = (out / "selected.txt").read_text().split()
    crowded, early, hung, late = ids[0], ids[1:4], ids[4], ids[5:]
    assert hung.endswith("::test_hung_until_released") and len(ids) == 8
    assert upstream_tests.finished(out / "pristine.jsonl") == {crowded, *early}
    oom = ("failed", "RuntimeError: CUDA error: out of memory")
    assert upstream_tests.read_report(out / "pristine.jsonl")[crowded] == oom
    assert _ran(tests) == sorted([crowded, *early, hung])
    assert "pristine: 4 of 8 selected cases without an outcome (cut off), 0 failures to run again alone not run: " \
           "incomplete, --resume continues it" in capsys.readouterr().out
    first, log = len((out / "pristine.jsonl").read_text().splitlines()), (out / "pristine.log").read_text()

    (tests / "released").touch()
    (tests / "crowded").unlink()
    assert upstream_tests.main([*argv, "--resume", "--workers", "2"]) == 0
    assert _ran(tests) == sorted([hung, *late, crowded])  # the case run again alone: out of memory the first time
    again = {row.split('"id": "')[1].split('"')[0] for row in (out / "pristine.jsonl").read_text().splitlines()[first:]}
    assert again == {hung, *late, next(t for t in again if t.endswith("::test_added_by_patch"))}
    assert (out / "pristine.resume.txt").read_text().split() == [hung, *late]
    assert (out / "pristine.rerun.txt").read_text().split() == [crowded]
    assert (out / "pristine.log").read_text().startswith(log) and len((out / "pristine.log").read_text()) > len(log)
    final = {**upstream_tests.read_report(out / "pristine.jsonl"),
             **upstream_tests.read_report(out / "pristine.rerun.jsonl")}
    assert {t: o for t, (o, _) in final.items() if t in ids} == dict.fromkeys(ids, "passed")
    printed = capsys.readouterr().out
    assert "resuming: 8 cases selected by the earlier call" in printed
    assert "pristine: 8 passed, 1 failed, 0 errors, 0 skipped" in printed  # the earlier call's and this one's
    assert "pristine: 0 of 8 selected cases without an outcome (cut off), 0 failures to run again alone not run\n" \
           in printed
    assert "| pristine | 8 | 1 | 0 | 0 | 1 | 1 |" in printed  # exit 1: the patch's test fails before the patch

    reports = [(out / f).read_text() for f in ("pristine.jsonl", "pristine.rerun.jsonl")]
    assert upstream_tests.main([*argv, "--resume", "--workers", "2"]) == 0
    assert _ran(tests) == [] and [(out / f).read_text() for f in ("pristine.jsonl", "pristine.rerun.jsonl")] == reports
    assert "pristine: 8 passed, 1 failed, 0 errors, 0 skipped" in capsys.readouterr().out


CROWDED = RAN + '''

@pytest.mark.parametrize("i", range(3))
def test_crowded_out(i):
    if (HERE / "crowded").exists():
        raise RuntimeError("CUDA error: out of memory")


def test_fine():
    pass
'''


def test_resume_runs_alone_only_the_failures_a_cut_off_rerun_left(tmp_path, monkeypatch, capsys):
    """An earlier call's reports, as a call cut off in its rerun leaves them: its parallel pass whole, three cases
    out of memory there, the first run again alone, the second cut off in its call. --resume runs the second and
    third alone, nothing else; the first's rerun outcome stands."""
    monkeypatch.delenv("FLASH_ATTENTION_ARCH", raising=False)
    tests, prefix = _stand_in(tmp_path, "test_crowded.py", CROWDED)
    out = tmp_path / "out"
    out.mkdir()
    crowded = [f"test_crowded.py::test_crowded_out[{i}]" for i in range(3)]
    fine = "test_crowded.py::test_fine"
    (out / "selected.txt").write_text("".join(f"{i}\n" for i in [*crowded, fine]))
    oom = "RuntimeError: CUDA error: out of memory"
    _rows(out / "pristine.jsonl", [(t, "setup", "passed", "") for t in [*crowded, fine]]
          + [(t, "call", "failed", oom) for t in crowded] + [(fine, "call", "passed", "")]
          + [(t, "teardown", "passed", "") for t in [*crowded, fine]])  # as xdist's workers interleave them
    _rows(out / "pristine.rerun.jsonl", [(crowded[0], "setup", "passed", ""), (crowded[0], "call", "passed", ""),
                                         (crowded[0], "teardown", "passed", ""), (crowded[1], "setup", "passed", "")])
    assert upstream_tests.main(["--tests", str(tests), "--files", "test_crowded.py", "--series", str(prefix),
                                "--out", str(out), "--variants", "0", "--workers", "2", "--resume",
                                "-k", "not added_by_patch"]) == 0
    assert _ran(tests) == crowded[1:]
    assert (out / "pristine.rerun.txt").read_text().split() == crowded[1:]
    assert upstream_tests.read_report(out / "pristine.rerun.jsonl") == dict.fromkeys(crowded, ("passed", ""))
    assert len(upstream_tests.read_report(out / "pristine.jsonl")) == 4  # the parallel pass: nothing ran again
    printed = capsys.readouterr().out
    assert "pristine: 4 passed, 0 failed, 0 errors, 0 skipped" in printed
    assert "pristine: 0 of 4 selected cases without an outcome (cut off), 0 failures to run again alone not run\n" \
           in printed
    assert "| pristine | 4 | 0 | 0 | 0 | 3 | 1 |" in printed  # exit 1: the pass's failures, run again alone since


def test_a_baseline_counts_the_outcomes_of_its_failures_run_again_alone(tmp_path):
    def phases(test_id, call):
        return [{"id": test_id, "when": "setup", "outcome": "passed", "message": ""},
                {"id": test_id, "when": "call", "outcome": call, "message": "CUDA error: out of memory" if call == "failed" else ""},
                {"id": test_id, "when": "teardown", "outcome": "passed", "message": ""}]

    first = tmp_path / "pristine.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in phases("t.py::a", "failed") + phases("t.py::b", "passed")))
    assert {t: o for t, (o, _) in upstream_tests.read_baseline(first).items()} == {"t.py::a": "failed", "t.py::b": "passed"}
    (tmp_path / "pristine.rerun.jsonl").write_text("".join(json.dumps(r) + "\n" for r in phases("t.py::a", "passed")))
    assert {t: o for t, (o, _) in upstream_tests.read_baseline(first).items()} == {"t.py::a": "passed", "t.py::b": "passed"}
    assert upstream_tests.read_baseline(tmp_path / "pristine.xml") == {}


SEES_GPU = """
import os

import pytest


@pytest.mark.parametrize("i", range(8))
def test_where(i):
    assert False, os.environ.get("CUDA_VISIBLE_DEVICES")
"""


def test_gpus_put_each_worker_on_one_of_them_round_robin(tmp_path, monkeypatch):
    """--gpus 5,7 with 2 workers: worker gw0 sees device 5 only, gw1 device 7 (CUDA_VISIBLE_DEVICES set in each worker
    before anything starts CUDA), so a variant can spread its workers over the GPUs of a larger machine; a list that is
    not device indices is refused with the rule."""
    monkeypatch.delenv("FLASH_ATTENTION_ARCH", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    tests, prefix = _stand_in(tmp_path, "test_sees_gpu.py", SEES_GPU)
    out = tmp_path / "out"
    upstream_tests.main(["--tests", str(tests), "--files", "test_sees_gpu.py", "--series", str(prefix), "--out",
                         str(out), "--variants", "0", "-k", "not added_by_patch", "--workers", "2", "--gpus", "5,7"])
    rows = [json.loads(line) for line in (out / "pristine.jsonl").read_text().splitlines()]
    seen = {(r["worker"], r["message"]) for r in rows if r["when"] == "call"}
    assert {m for _, m in seen} == {"AssertionError: 5", "AssertionError: 7"}, seen
    assert all(m == {"gw0": "AssertionError: 5", "gw1": "AssertionError: 7"}[w] for w, m in seen), seen
    with pytest.raises(SystemExit, match="--gpus 0,x: comma-separated CUDA device indices"):
        upstream_tests.main(["--tests", str(tests), "--files", "test_sees_gpu.py", "--series", str(prefix), "--out",
                             str(out), "--gpus", "0,x"])


TUNED_STAND_IN = '''
import pytest


@pytest.mark.parametrize("dtype", ["bf16"])
@pytest.mark.parametrize("mha_type", ["mha", "mqa", "gqa"])
@pytest.mark.parametrize("local_enum", [0, 1])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 96, 128, 192])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 239), (113, 203), (1024, 1024)])
def test_flash_attn_output(seqlen_q, seqlen_k, d, causal, local_enum, mha_type, dtype):
    pass


@pytest.mark.parametrize("qhead_per_kvhead", [1, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [96, 128])
def test_flash_attn_varlen_cumsum_metadata_paths(d, causal, qhead_per_kvhead):
    pass


@pytest.mark.parametrize("i", range(40))
def test_unrelated(i):
    pass
'''


def test_the_cases_that_reach_a_tuned_entry_of_the_series_go_first_then_the_hash_sample(tmp_path):
    """The shipped series' tables (its patched config.py) decide: the MHA cases of a tuned head dim without a local
    window (the stand-in's GQA ratios 2 and 6 reach no entry), and of the qhead_per_kvhead cases the causal d128 GQA 4
    entry's, not d96 GQA 4 (no prefill entry); then --sample's share of the rest, as without the series."""
    tests = tmp_path / "fa" / "tests" / "cute"
    tests.mkdir(parents=True)
    (tests / "test_stand_in.py").write_text(TUNED_STAND_IN)
    package, work = upstream_tests.installed_package(), tmp_path / "work"
    sites = {}
    for name, patches in (("pristine", []), ("series", upstream_tests.series_patches())):
        sites[name] = work / f"site-{name}"
        sites[name].mkdir(parents=True)
        upstream_tests.make_variant(sites[name], package, patches)
    ids = upstream_tests.collect(sites["pristine"], tests, ["test_stand_in.py"], None, tmp_path, 120)
    params = upstream_tests.read_params(tmp_path / "params.jsonl")
    assert len(ids) == 144 + 8 + 40 and set(params) == set(ids)
    assert params[ids[0]] == {"seqlen_q": 1, "seqlen_k": 239, "d": 64, "causal": False, "local_enum": 0, "mha_type": "mha",
                              "dtype": "bf16"}
    config = upstream_tests.load_config(sites["series"])
    chosen, first = upstream_tests.prioritized(ids, params, config, 4)

    def tuned(node):
        p = params[node]
        if "mha_type" in p:
            return p["mha_type"] == "mha" and p["d"] in (64, 96, 128) and p["local_enum"] == 0
        return p["qhead_per_kvhead"] == 1 or (p["d"], p["causal"]) == (128, True)

    expected = [n for n in ids if "test_unrelated" not in n and tuned(n)]
    assert first == len(expected) == 3 * 3 * 2 + 4 + 1 and chosen[:first] == expected
    rest = [n for n in ids if n not in expected]
    assert chosen[first:] == upstream_tests.sample(rest, 4)
    # the pristine tables have no entry of their own: the hash sample alone, as before
    assert upstream_tests.prioritized(ids, params, upstream_tests.load_config(sites["pristine"]), 4) == (upstream_tests.sample(ids, 4), 0)
