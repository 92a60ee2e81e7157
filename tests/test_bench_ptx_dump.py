"""bench/ptx_dump.py: an unknown config name is refused with the known ones; the dump of one config is deterministic
(two processes write byte-identical PTX for the target arch), which is what lets a refactor be checked by a diff."""

import subprocess
import sys

import pytest

import bench_helpers
from bench import ptx_dump

ROOT = bench_helpers.ROOT


def test_an_unknown_config_name_is_refused_with_the_known_ones(tmp_path, capsys):
    bench = ptx_dump
    with pytest.raises(SystemExit) as done:
        bench.main([str(tmp_path), "--configs", "tma_64x64_qr_chunked_gqa4,tma_999x1"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "--configs: unknown name(s) ['tma_999x1']" in err and "sm120_128x64_causal" in err
    assert not any(tmp_path.iterdir())  # refused before any compile or file
    with pytest.raises(SystemExit) as done:  # the inputs' dtype: the two the kernels take
        bench.main([str(tmp_path), "--configs", "tma_lpt_64x64_qr_prefill_gqa4", "--dtype", "fp32"])
    assert done.value.code == 2 and "invalid choice: 'fp32'" in capsys.readouterr().err


@pytest.mark.compile
def test_two_dumps_of_one_config_are_byte_identical_and_ir_is_written_beside_the_ptx(tmp_path):
    """Two compiles of one config give the same PTX byte for byte, the first with --ir (so writing the DSL program
    beside the PTX changes nothing in it): two compiles, not three."""
    name = "sm120_128x64_causal"
    for run, extra in (("a", ["--ir"]), ("b", [])):
        done = subprocess.run([sys.executable, "bench/ptx_dump.py", str(tmp_path / run), "--configs", name, *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"{name}: 1 kernel(s)" in done.stdout
    first, second = (tmp_path / run / f"{name}.ptx" for run in ("a", "b"))
    text = first.read_text()
    assert ".target sm_120a" in text and ".entry" in text and "mma.sync" in text
    assert first.read_bytes() == second.read_bytes()
    ir = (tmp_path / "a" / f"{name}.mlir").read_text()
    assert "cuda.kernel @kernel" in ir and "!cute_nvgpu" in ir
    assert not (tmp_path / "b" / f"{name}.mlir").exists()
