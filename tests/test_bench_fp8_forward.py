"""bench/fp8_forward.py on the CPU (--dry-run: fp32 attention on the dequantized tiles in place of the kernel): every
(problem, config) gated on the three input kinds, the FP8 rules' refusals reported by name, bad configs refused."""

import pytest

from bench import fp8_forward
from fa4tune.config import ConfigError


def test_dry_run_gates_each_config_on_each_input_kind_and_reports_refusals(capsys):
    assert fp8_forward.main(["--dry-run", "--only", "b2 s4096 h16 d128", "--configs", "default,64x64s2p,128x128s2"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| b2 s4096 h16 d128")]
    gated = [r for r in rows if "| pass |" in r]
    assert len(gated) == 2 * 2 * 3  # 2 problems (causal and not) x 2 fitting configs x 3 input kinds
    assert sum("| 64x64s2p |" in r for r in gated) == 2 * 3  # P V on e4m3 (V dequantized per channel here)
    assert {kind for kind in fp8_forward.KINDS if any(f"| {kind} |" in r for r in gated)} == set(fp8_forward.KINDS)
    refused = [r for r in rows if "refused: smem_capacity" in r]
    assert len(refused) == 2 and all("128x128s2" in r for r in refused)
    assert "4 of 4 (problem, config) pairs pass the FP8 gate" in out


def test_a_bad_config_is_one_error_naming_the_form():
    with pytest.raises(ConfigError, match="fp8_config.*128x64s1.*'128x64'"):
        fp8_forward.parse_configs("128x64")


def test_the_dry_runs_p_rounding_is_e4m3s_and_leaves_the_lse_alone():
    import torch

    from fa4tune.harness import gate

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 96, 4, 64), torch.randn(1, 128, 2, 64), torch.randn(1, 128, 2, 64)
    out, lse = fp8_forward.p_e4m3_attention(q, k, v, True, 0.125)
    ref = gate.reference_attention(q, k, v, True, 0.125)
    assert torch.allclose(lse, ref.lse, atol=1e-5)  # the row sums come from the unrounded P
    rel = ((out - ref.out).norm() / ref.out.norm()).item()
    assert 2 ** -8 < rel < 2 ** -4  # P's 3-bit mantissa shows, and no more than that
