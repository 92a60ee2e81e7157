"""What fa4-tune takes from flash-attn-4 (fa4tune/upstream.py): a release that moves or changes a symbol we use, or
the text our host path edits, fails one test here that names it, before any kernel compiles (issue 67)."""

import pytest

from fa4tune import defaults, upstream
from fa4tune.config import ProblemClass
from fa4tune.sm120_interface import EDITED, edit_problems


@pytest.mark.parametrize("symbol", sorted(upstream.SYMBOLS))
def test_the_installed_release_has_each_symbol_we_use(symbol):
    assert upstream.problems({symbol: upstream.SYMBOLS[symbol]}) == {}


def test_every_symbol_our_code_takes_is_registered():
    used = set(upstream.uses()) | set(upstream.overridden())
    missing = sorted(used - set(upstream.SYMBOLS))
    assert not missing, f"taken from flash-attn-4 but not in fa4tune.upstream.SYMBOLS: {missing}"
    # the registry holds nothing we no longer take (a stale entry would hide a re-pin's real surface)
    assert sorted(set(upstream.SYMBOLS) - used) == []


def test_the_scan_sees_imports_module_attributes_and_overrides():
    used = upstream.uses()
    assert "kernels/tuned_forward_sm120.py" in used["flash_attn.cute.flash_fwd_sm120:FlashAttentionForwardSm120"]
    assert "flash_attn.cute.ampere_helpers:gemm" in used  # `sm80_utils.gemm` through `ampere_helpers as sm80_utils`
    assert "flash_attn.cute.flash_fwd:FlashAttentionForwardSm80.compute_one_n_block" in upstream.overridden()


@pytest.mark.parametrize("what", [what for _, edits in EDITED for _, _, what in edits])
def test_each_host_path_edit_matches_the_pinned_interface_once(what):
    assert edit_problems().get(what) is None


def test_a_moved_or_changed_symbol_is_one_line_naming_it():
    gone = "flash_attn.cute.interface:_flash_attn_fwd_moved"
    changed = "flash_attn.cute.config:select_initial_fwd_tile"
    found = upstream.problems({gone: ("q",), changed: ("inputs", "arch")})
    assert set(found) == {gone, changed}
    assert found[gone].startswith(f"{gone}: not in flash-attn-4 ") and "\n" not in found[gone]
    assert found[changed] == (f"{changed}: parameters ('inputs',) in flash-attn-4 {upstream.PINNED_VERSION}, "
                              f"('inputs', 'arch') in {upstream.PINNED_VERSION}")


def test_the_pin_is_the_installed_release():
    from importlib.metadata import version

    assert version("flash-attn-4") == upstream.PINNED_VERSION


@pytest.mark.parametrize("head_dim, tile_n, stages", [(64, 128, 2), (96, 64, 1), (128, 64, 1)])
def test_upstream_defaults_are_read_from_its_config_code(head_dim, tile_n, stages):
    pc = ProblemClass(head_dim, head_dim, causal=True)
    forward, backward = defaults.upstream_forward(pc), defaults.upstream_backward(pc)
    assert (forward.tile_m, forward.tile_n, forward.num_threads, forward.num_stages) == (128, tile_n, 128, 1)
    assert (backward.m_block_size, backward.n_block_size, backward.num_stages_Q, backward.num_threads) == (64, 64, stages, 128)
    assert upstream.config_module().__file__.endswith("flash_attn/cute/config.py")
