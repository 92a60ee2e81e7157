"""export carries a backward winner of the coordinate-mask class (kernels/cmask_backward_sm120.py) as upstream's
class with upstream's mask fixed (search/reviewing/mask_fix.py): the fix's edits, its own upstream test before and
after, the real study's patch applying to the pinned wheel and compiling for sm_120a with the S/dP warps along n."""

from __future__ import annotations

import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fa4tune.config import BackwardConfig, ConfigError
from search.reviewing import mask_fix
from search_helpers import ROOT, run_cli
from test_search_export import _pristine_checkout

STUDY = ROOT / "docs/measurements/data/2026-12-06-h200-bwd-cmask.db.xz"  # the causal d128 study, incumbent sm120_cmask
WINNER = BackwardConfig(m_block_size=64, n_block_size=64, num_stages_Q=2, num_stages_dO=1, num_threads=256, dQ_swapAB=True,
                        AtomLayoutMSdP=4, AtomLayoutNdKV=2, AtomLayoutMdQ=2)  # 8 warps: 4 along m, 2 along n


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("mask-fix")
    (tmp / "study.db").write_bytes(lzma.decompress(STUDY.read_bytes()))
    done = run_cli("export", "--storage", f"sqlite:///{tmp / 'study.db'}", "--out", tmp / "sm120-tuned.patch")
    assert done.returncode == 0, done.stderr
    return tmp


def test_the_fix_edits_each_r2p_choice_once_and_names_the_text_it_cannot_find():
    pristine = mask_fix.pristine_mask()
    fixed = mask_fix.patch_mask(pristine)
    assert "def r2p_columns_ordered(t0ScS_mn) -> bool:" in fixed and fixed.count(f"not self.swap_AB and {mask_fix.CHECK})") == 3
    assert "r2p_columns_ordered" not in pristine and fixed.replace(mask_fix.HELPER, "").count("\n") - pristine.count("\n") == 1
    with pytest.raises(ConfigError) as err:
        mask_fix.patch_mask(pristine.replace("r2p_local = const_expr(not self.swap_AB)\n", ""))
    assert err.value.rule == "upstream_source" and "cannot patch local mask R2P" in str(err.value)


def test_the_real_study_exports_upstreams_class_with_the_mask_fix_and_the_patch_applies(exported, tmp_path):
    patch = (exported / "sm120-tuned.patch").read_text()
    assert "diff --git a/flash_attn/cute/mask.py b/flash_attn/cute/mask.py" in patch
    assert "new file mode 100644" in patch and f"b/{mask_fix.TEST_PATH}" in patch
    assert "Fixed: flash_attn/cute/mask.py." in patch and "(FlashAttentionBackwardSm120; trial #1, measured 3 times, confirmed)" in patch
    entry = ("num_stages_Q=2,", "num_stages_dO=1,", "num_threads=256,", "AtomLayoutMSdP=4,", "AtomLayoutNdKV=2,", "AtomLayoutMdQ=2,")
    assert all(f"+                {knob}\n" in patch for knob in entry)  # one knob a line, as ruff format writes them
    pr = (exported / "sm120-tuned.pr.md").read_text()
    assert f"- {mask_fix.CHANGE}" in pr and f"- `pytest {mask_fix.TEST_PATH}`" in pr and "in place of" not in pr
    check = subprocess.run(["git", "apply", "--check", str(exported / "sm120-tuned.patch")],
                           cwd=_pristine_checkout(tmp_path / "fa"), capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    # upstream's kernels only: the best trial of upstream's class (warps along m) and no mask.py
    only = run_cli("export", "--storage", f"sqlite:///{exported / 'study.db'}", "--upstream-kernels-only", "--dry-run")
    assert only.returncode == 0, only.stderr
    assert "flash_attn/cute/mask.py" not in only.stdout and "kernel 'sm120_cmask'" in only.stdout


def _checkout_with(tmp_path: Path, patch: Path | None) -> Path:
    """The pinned package laid out as upstream's repository, the export applied (or not), the fix's test in place."""
    checkout = _pristine_checkout(tmp_path / "flash-attention")
    if patch is not None:
        subprocess.run(["git", "apply", str(patch)], cwd=checkout, check=True)
    else:
        (checkout / mask_fix.TEST_PATH).parent.mkdir(parents=True, exist_ok=True)
        (checkout / mask_fix.TEST_PATH).write_text(mask_fix.TEST_TEMPLATE.read_text())
    (checkout / "flash_attn" / "__init__.py").touch()
    return checkout


@pytest.mark.parametrize("fixed", [False, True])
def test_the_fix_s_own_test_fails_before_it_and_passes_after(exported, tmp_path, fixed):
    checkout = _checkout_with(tmp_path, exported / "sm120-tuned.patch" if fixed else None)
    env = {**os.environ, "PYTHONPATH": str(checkout), "CUTE_DSL_ARCH": "sm_120a"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", mask_fix.TEST_PATH],
                          cwd=checkout, capture_output=True, text=True, env=env, timeout=600)
    if fixed:
        assert done.returncode == 0 and "7 passed" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    else:  # the pristine mask has no column check to import
        assert done.returncode != 0 and "cannot import name 'r2p_columns_ordered'" in done.stdout, done.stdout[-2000:]


@pytest.mark.compile
def test_the_patched_package_compiles_the_causal_entry_with_warps_along_n_for_sm120a_and_picks_it(exported, tmp_path):
    checkout = _checkout_with(tmp_path, exported / "sm120-tuned.patch")
    jobs = [{"kind": "bwd", "head_dim": 128, "causal": True, "qhead_per_kvhead": 1}]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(ROOT)]), "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "0"}
    done = subprocess.run([sys.executable, str(ROOT / "tests/patched_interface_probe.py")], input=json.dumps(jobs),
                          capture_output=True, text=True, env=env, timeout=800)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("PROBE "))[len("PROBE "):])
    (bwd,) = report["jobs"]
    assert report["interface"].startswith(str(checkout))
    assert bwd["kernel"] == {k: v for k, v in WINNER.to_dict().items() if k != "kernel"}
    assert "FlashAttentionBackwardSm120" in bwd["compiled"] and bwd["postprocess_threads"] == [256]
    # the masks traced with the S/dP MMA's 2 warps along n asked the column check, and it said R2P does not hold
    assert bwd["r2p_columns_ordered"] and not any(bwd["r2p_columns_ordered"])
