"""The backward class that fixes an upstream bug (issue 44 item 3; kernels/cmask_backward_sm120.py). sm120_cmask: a
causal mask by each element's coordinates, so causal S/dP MMAs may put warps along n (8 warps on a 64x64 tile); it is
exempt from that one rule (`fixes`). sm120_edge (kernels/edge_mask_backward_sm120.py): upstream's class with its mask
on the tiles it cuts only, each query block traced masked and not. (V in registers, sm120_vregs, left the tree on
2026-12-06 with its tests: docs/measurements/data/2026-12-06-vregs-backward.patch.)"""

import subprocess
import sys
from pathlib import Path

import pytest

import experiment
from fa4tune.config import BackwardConfig, ProblemClass
from fa4tune.feasibility import GATE_RULES, check_backward
from fa4tune.targets import get_target
from kernels.cmask_backward_sm120 import CausalAnyWarpsBackwardSm120
from kernels.cmask_kregs_backward_sm120 import KRegsBackwardSm120, _DQFromRegisters
from kernels.edge_mask_backward_sm120 import EdgeMaskBackwardSm120, tile_needs_mask

TARGET = get_target("sm120")
D128 = ProblemClass(128, 128, False)
D128_CAUSAL = ProblemClass(128, 128, True)
EIGHT = BackwardConfig(m_block_size=64, n_block_size=64, num_stages_Q=2, num_threads=256, AtomLayoutMSdP=4,
                       AtomLayoutNdKV=2, AtomLayoutMdQ=2)  # 8 warps, 4 along m and 2 along n


def test_a_class_that_names_an_unknown_rule_is_refused(monkeypatch):
    assert CausalAnyWarpsBackwardSm120.fixes <= GATE_RULES
    monkeypatch.setattr(CausalAnyWarpsBackwardSm120, "fixes", frozenset({"no_such_rule"}))
    verdict = check_backward(BackwardConfig(**{**EIGHT.to_dict(), "kernel": "sm120_cmask"}), D128_CAUSAL, TARGET)
    assert not verdict.ok and verdict.rule == "fixes_known" and "no_such_rule" in verdict.message


def test_causal_warps_along_n_binds_upstream_s_class_and_not_the_coordinate_mask_s():
    pc, eight = D128_CAUSAL, EIGHT
    upstream = check_backward(eight, pc, TARGET)
    assert not upstream.ok and upstream.rule == "causal_bwd_SdP_warps_along_m"
    assert check_backward(BackwardConfig(**{**eight.to_dict(), "kernel": "sm120_cmask"}), pc, TARGET).ok
    # off causal problems the class is upstream's kernel under another name: refused, so a study never draws it twice
    noncausal = check_backward(BackwardConfig(**{**eight.to_dict(), "kernel": "sm120_cmask"}), D128, TARGET)
    assert not noncausal.ok and noncausal.rule == "cmask_causal_only" and "d128-noncausal-bf16 is not causal" in noncausal.message


def test_the_edge_mask_class_holds_the_non_causal_entries_and_refuses_causal_problems():
    for d in (128, 96, 64):  # d96 / d64 since 2026-12-06-h100-s8-edge-ut-gqa4.md
        entry = experiment.BACKWARD_DISPATCH[f"d{d}-noncausal-bf16"]
        assert experiment.kernel_class(entry) is EdgeMaskBackwardSm120
        assert check_backward(entry, ProblemClass(d, d, False), TARGET).ok
    entry = experiment.BACKWARD_DISPATCH["d128-noncausal-bf16"]
    # measured on non-causal problems only; on the causal K-in-registers class the same mixin lost (retired)
    causal = check_backward(entry, D128_CAUSAL, TARGET)
    assert not causal.ok and causal.rule == "causal_supported"


def test_the_k_in_registers_twin_routes_only_the_dq_gemm_and_restores_upstream_s_helpers():
    from flash_attn.cute import ampere_helpers, flash_bwd

    calls = []
    helpers = type("Helpers", (), {"gemm": lambda self, *a, **k: calls.append((a[3], k)), "other": 7})()
    proxy = _DQFromRegisters(helpers, tdQrK="K fragment", first=True)
    proxy.gemm("mma", "acc", "dS", "Q fragment", "sA", "sB", "copyA", "copyB", swap_AB=True)
    assert calls == [("Q fragment", {"A_in_regs": False, "B_in_regs": False, "swap_AB": True})] and proxy.other == 7
    assert KRegsBackwardSm120.searched is True and flash_bwd.sm80_utils is ampere_helpers
    assert check_backward(BackwardConfig(**{**EIGHT.to_dict(), "kernel": "sm120_cmask_kregs"}), D128_CAUSAL, TARGET).ok


def test_a_packed_trace_of_the_k_in_registers_class_is_the_coordinate_mask_body_unchanged(monkeypatch):
    # packed batches gated the coordinate-mask body (2026-12-06-h100-models-twins-varlen.md), not the routed one
    from functools import partial
    from types import SimpleNamespace

    from flash_attn.cute import ampere_helpers, flash_bwd

    seen = []
    monkeypatch.setattr(CausalAnyWarpsBackwardSm120, "compute_one_m_block",
                        lambda self, m_block, *a, **k: seen.append(flash_bwd.sm80_utils) or "body")
    class Mask:  # what the body's mask_fn is bound to: upstream's AttentionMask
        def __init__(self, info):
            self.seqlen_info = info

        def apply(self, *a, **k):
            pass

    kernel = object.__new__(KRegsBackwardSm120)
    for packed_q, packed_k in ((True, False), (False, True)):
        mask = Mask(SimpleNamespace(has_cu_seqlens_q=packed_q, has_cu_seqlens_k=packed_k))
        assert kernel.compute_one_m_block(0, mask_fn=partial(mask.apply, n_block=0), mma_params=None) == "body"
    assert seen == [ampere_helpers, ampere_helpers]  # upstream's helpers: no gemm routed through registers


@pytest.mark.compile
def test_a_causal_trace_runs_the_coordinate_mask_and_8_warps_spill_nothing():
    # in a process of its own: the DSL fixes its arch on import
    script = """
import os, sys
os.environ.update(FLASH_ATTENTION_ARCH="sm_120", CUTE_DSL_ARCH="sm_120a", FLASH_ATTENTION_NUM_SMS="132", CUTE_DSL_KEEP="cubin")
os.environ.pop("FA4TUNE_KERNEL_CACHE", None)
sys.path.insert(0, ROOT)
from fa4tune import fake_compile
from fa4tune.config import BackwardConfig, Problem
from fa4tune.harness.candidates import load_experiment
exp = load_experiment(ROOT + "/experiment.py")
config = BackwardConfig(m_block_size=64, n_block_size=64, num_stages_Q=2, num_threads=256, AtomLayoutMSdP=4,
                        AtomLayoutNdKV=2, AtomLayoutMdQ=2, kernel="sm120_cmask")  # 8 warps on a d128 causal tile
from dataclasses import replace
from kernels.cmask_backward_sm120 import CoordinateMask
from kernels.cmask_kregs_backward_sm120 import _DQFromRegisters
# the second keeps K in registers for dQ (one gemm routed)
for kernel in ("sm120_cmask", "sm120_cmask_kregs"):
    facts = fake_compile.compile_shapes(exp, "bwd", replace(config, kernel=kernel), [Problem(1, 256, 256, 2, 2, 128, 128, True)])
    print("spills", facts.spill_store_bytes, facts.registers <= 255, facts.cubin_error or "read")
    print("traced", CoordinateMask.traces, "routed", _DQFromRegisters.routed)
# the non-causal d128 entry: upstream's class with its seqlen_k mask on the last key block only, each query block
# traced twice (masked and not)
from kernels.edge_mask_backward_sm120 import MaskWhereCut
entry = exp.BACKWARD_DISPATCH["d128-noncausal-bf16"]
facts = fake_compile.compile_shapes(exp, "bwd", entry, [Problem(1, 256, 256, 2, 2, 128, 128, False)])
print("spills", facts.spill_store_bytes, facts.registers <= 255, facts.cubin_error or "read")
print(entry.kernel, "split", MaskWhereCut.split)
""".replace("ROOT", repr(str(Path(experiment.__file__).parent)))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-6:] == ["spills 0 True read", "traced 1 routed 0", "spills 0 True read",
                                             "traced 2 routed 1", "spills 0 True read", "sm120_edge split 1"], done.stdout[-500:]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tile_m, tile_n", [(64, 64), (32, 128), (128, 32), (64, 128)])
def test_tile_needs_mask_is_whether_the_mask_cuts_an_element_of_the_tile(tile_m, tile_n, causal):
    import numpy as np

    checked = skipped = 0
    for seqlen_q, seqlen_k in ((256, 256), (200, 256), (256, 200), (1, 300), (300, 1), (129, 63), (64, 64)):
        for m_block in range(-(-seqlen_q // tile_m)):
            for n_block in range(-(-seqlen_k // tile_n)):
                rows = m_block * tile_m + np.arange(tile_m)[:, None]
                cols = n_block * tile_n + np.arange(tile_n)[None, :]
                limit = np.minimum(rows + 1 + seqlen_k - seqlen_q, seqlen_k) if causal else seqlen_k
                cut = (cols >= limit).any()  # CoordinateMask's rule; without causal, upstream's seqlen_k mask
                needs = tile_needs_mask(m_block, n_block, tile_m, tile_n, seqlen_q, seqlen_k, causal)
                assert needs == cut, (seqlen_q, seqlen_k, m_block, n_block)
                checked, skipped = checked + 1, skipped + (not needs)
    assert 0 < skipped < checked  # below the diagonal (causal) and inside seqlen_k: the tiles left unmasked
