"""bench/upstream_tests.py on the CPU: a patch series applied to copies of the installed flash-attn-4 (a one-patch
stand-in here; that the shipped series applies in order is tests/test_search_export_series.py's), a stand-in for
upstream's tests run against each (the SM120 capability answered to test files only), the outcomes read back from
the per-test report written as each test lands and every difference from the pristine run named."""

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


def test_bad_input_gets_one_error_naming_the_rule(tmp_path):
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


def test_the_sample_keeps_small_functions_whole_and_takes_a_fixed_share_of_large_ones():
    ids = [f"t.py::big[{i}]" for i in range(1024)] + [f"t.py::small[{i}]" for i in range(5)] + ["t.py::one"]
    chosen = upstream_tests.sample(ids, 4)
    assert [n for n in chosen if "small" in n or "one" in n] == ids[1024:]
    big = [n for n in chosen if "big" in n]
    assert len(big) == 40 and big == sorted(big, key=ids.index)  # 4 * log2(1024), in collection order
    assert upstream_tests.sample(ids, 4) == chosen and upstream_tests.sample(ids, 0) == ids
