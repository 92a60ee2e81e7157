"""Device detection and the native/emulated choice, with faked device properties."""

import subprocess
from types import SimpleNamespace

import pytest

from fa4tune.harness import gpu
from fa4tune.targets import get_target

SM120 = get_target("sm120")


def props(name, major, minor, sms, **extra):
    return SimpleNamespace(name=name, major=major, minor=minor, multi_processor_count=sms, **extra)


H200 = gpu.device_info(props("NVIDIA H200", 9, 0, 132, L2_cache_size=60 * 2**20, total_memory=141 * 10**9), smem_per_block_optin=232448)
RTX5090 = gpu.device_info(props("NVIDIA GeForce RTX 5090", 12, 0, 170))
A100 = gpu.device_info(props("NVIDIA A100-SXM4-80GB", 8, 0, 108))
T4 = gpu.device_info(props("Tesla T4", 7, 5, 40))
GB10 = gpu.device_info(props("NVIDIA GB10", 12, 1, 48))


def test_device_info_reads_a_property_object():
    assert H200.capability == (9, 0) and H200.num_sms == 132
    assert H200.smem_per_block_optin == 232448 and H200.l2_cache_bytes == 60 * 2**20
    assert H200.capability_text == "9.0"
    assert RTX5090.smem_per_block_optin is None  # unknown, not made up
    with_optin = gpu.device_info(props("x", 9, 0, 1, shared_memory_per_block_optin=1234))
    assert with_optin.smem_per_block_optin == 1234


def test_target_capability_from_its_arch():
    assert gpu.target_capability(SM120) == (12, 0)


@pytest.mark.parametrize("device, mode", [(RTX5090, "native"), (H200, "emulated"), (A100, "emulated"), (GB10, "emulated"), (T4, "unsupported")])
def test_mode_selection(device, mode):
    assert gpu.select_mode(device, SM120) == mode


def test_emulation_env_selects_sm120_with_the_devices_sm_count_and_drops_cross_compiling():
    base = {"PATH": "/bin", "CUTE_DSL_ARCH": "sm_120a", "FLASH_ATTENTION_NUM_SMS": "170"}
    env = gpu.emulation_env(H200, SM120, base)
    assert env["FLASH_ATTENTION_ARCH"] == "sm_120"
    assert env["FLASH_ATTENTION_NUM_SMS"] == "132"
    assert "CUTE_DSL_ARCH" not in env and env["PATH"] == "/bin"
    assert base["CUTE_DSL_ARCH"] == "sm_120a"  # the caller's mapping is not changed


def test_the_devices_own_path_has_no_arch_override():
    base = {"PATH": "/bin", "FLASH_ATTENTION_ARCH": "sm_120", "FLASH_ATTENTION_NUM_SMS": "132", "CUTE_DSL_ARCH": "sm_120a"}
    assert gpu.device_own_env(base) == {"PATH": "/bin"}
    assert gpu.kernel_env(RTX5090, SM120, "native", base) == {"PATH": "/bin"}
    assert gpu.kernel_env(H200, SM120, "emulated", base)["FLASH_ATTENTION_ARCH"] == "sm_120"


def test_run_label():
    assert gpu.run_label(SM120, "NVIDIA H200", "emulated") == "target=sm120 device=NVIDIA H200 mode=emulated"


def test_nvidia_smi_line_parsing():
    clocks = gpu.parse_nvidia_smi("1980, 3201, 45, 310.52")
    assert (clocks.sm_clock_mhz, clocks.memory_clock_mhz, clocks.temperature_c, clocks.power_w) == (1980, 3201, 45, 310.52)
    assert clocks.short() == "sm 1980 MHz, mem 3201 MHz, 45 C, 311 W (nvidia-smi)"
    partial = gpu.parse_nvidia_smi("345, 3201, 30, [N/A]")
    assert partial.power_w is None and partial.short() == "sm 345 MHz, mem 3201 MHz, 30 C, ? (nvidia-smi)"


class FakeNvml:
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 1, 0

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return 1980 if kind == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetTemperature(self, handle, kind):
        return 41

    def nvmlDeviceGetPowerUsage(self, handle):
        return 250500  # milliwatts


def test_clocks_through_nvml_then_nvidia_smi_then_unknown():
    via_nvml = gpu.read_clocks(nvml=FakeNvml())
    assert via_nvml.source == "nvml" and via_nvml.power_w == 250.5 and via_nvml.temperature_c == 41

    class Broken(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("NVML not found")

    def smi(cmd, **kw):
        assert cmd[0] == "nvidia-smi" and "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw" in cmd
        return subprocess.CompletedProcess(cmd, 0, stdout="1755, 3201, 52, 400.00\n", stderr="")

    assert gpu.read_clocks(nvml=Broken(), run=smi).sm_clock_mhz == 1755

    def missing(cmd, **kw):
        raise FileNotFoundError("nvidia-smi")

    unknown = gpu.read_clocks(nvml=Broken(), run=missing)
    assert unknown.source == "unknown" and unknown.short() == "clocks unknown"
