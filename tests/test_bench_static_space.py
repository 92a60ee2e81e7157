"""bench/static_space.py: a kernel class with no feasible config of the class is refused before any compile, naming
the ones that have some; the summary and the ranking read the facts as the static check writes them."""

import pytest

from bench import static_space
from fa4tune.config import ConfigError
from fa4tune.static_check import StaticFacts


def _facts(kernel, tile_m, threads, registers, ctas, spill=0, status="ok"):
    config = {"kernel": kernel, "tile_m": tile_m, "tile_n": 64, "num_threads": threads, "num_stages": 1, "Q_in_regs": True}
    return StaticFacts("fwd", "d128-causal-bf16", config, status, registers=registers, spill_store_bytes=spill,
                       spill_load_bytes=spill, dynamic_smem_bytes=33792, num_threads=threads, blocks_per_sm=ctas,
                       occupancy_limiter="registers")


def test_an_unknown_kernel_is_refused_with_the_kernels_that_have_feasible_configs(capsys):
    bench = static_space
    with pytest.raises(ConfigError, match=r"kernels: --kernels names \['sm120_wgmma'\], which have no feasible config") as err:
        bench.main(["--problem-class", "d128-causal-bf16", "--kernels", "sm120,sm120_wgmma"])
    assert "sm120_tma" in str(err.value)
    assert "compiler processes" not in capsys.readouterr().out  # refused before anything started


def test_summary_counts_spills_and_ctas_and_top_ranks_by_resident_warps():
    bench = static_space
    facts = [_facts("sm120", 64, 128, 214, 2), _facts("sm120", 128, 256, 255, 1, spill=96),
             _facts("sm120_tma", 64, 128, 168, 3), _facts("sm120_tma", 256, 256, 0, 0, status="compile_error")]
    rows = bench.summary(facts)
    assert "| sm120 | 2 | 2 | 1 | 0 | 1: 1, 2: 1 |" in rows
    assert "| sm120_tma | 2 | 1 | 0 | 1 | 3: 1 |" in rows
    ranked = bench.top(facts, 3)[2:]
    assert ranked[0].startswith("| sm120_tma 64x64 t128 s1 Qr | 168 | 0/0 |") and "| 3 | 12 |" in ranked[0]
    # 2 x 4 warps and 1 x 8 warps tie at 8 warps per SM: the one without spills first
    assert ranked[1].startswith("| sm120 64x64 t128 s1 Qr | 214 |") and ranked[2].startswith("| sm120 128x64 t256 s1 Qr | 255 | 96/96 |")
