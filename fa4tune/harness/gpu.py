"""The GPU that is present, and how the SM120 kernels run on it (natively, or emulated).

On an SM 12.0 GPU the SM120 classes run natively. On any other SM80+ GPU they run emulated: upstream's
interface builds the SM120 classes (SM80 `mma.sync` code) when FLASH_ATTENTION_ARCH=sm_120, compiled for
the local GPU, with FLASH_ATTENTION_NUM_SMS set to the local SM count. The target's rules (99 KB of shared
memory per block) stay in force either way: feasibility is checked against the target, never the device.

The functions that decide take plain property objects, so tests can pass fakes.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from fa4tune.targets import TARGETS, Target

NATIVE, EMULATED, UNSUPPORTED = "native", "emulated", "unsupported"
MIN_EMULATION_CAPABILITY = (8, 0)  # the SM120 classes are SM80 mma.sync code
# Variables that choose or compile kernels for an arch other than the local GPU's.
ARCH_VARIABLES = ("FLASH_ATTENTION_ARCH", "FLASH_ATTENTION_NUM_SMS", "CUTE_DSL_ARCH")


@dataclass(frozen=True)
class DeviceInfo:
    """What the harness needs to know about the GPU it runs on."""

    name: str
    capability: tuple[int, int]
    num_sms: int
    smem_per_block_optin: int | None = None  # bytes one block may opt into; None when unknown
    l2_cache_bytes: int | None = None
    total_memory_bytes: int | None = None
    index: int = 0

    @property
    def capability_text(self) -> str:
        return f"{self.capability[0]}.{self.capability[1]}"


def device_info(props: Any, index: int = 0, smem_per_block_optin: int | None = None) -> DeviceInfo:
    """A DeviceInfo from a `torch.cuda.get_device_properties`-like object (fakes welcome)."""
    optin = smem_per_block_optin or getattr(props, "shared_memory_per_block_optin", None)
    return DeviceInfo(
        name=str(props.name),
        capability=(int(props.major), int(props.minor)),
        num_sms=int(props.multi_processor_count),
        smem_per_block_optin=int(optin) if optin else None,
        l2_cache_bytes=getattr(props, "L2_cache_size", None),
        total_memory_bytes=getattr(props, "total_memory", None),
        index=index,
    )


def _smem_per_block_optin(index: int) -> int | None:
    # torch's device properties do not carry the opt-in figure; the CUDA runtime does.
    try:
        from cuda.bindings import runtime

        err, value = runtime.cudaDeviceGetAttribute(runtime.cudaDeviceAttr.cudaDevAttrMaxSharedMemoryPerBlockOptin, index)
        return int(value) if int(err) == 0 else None
    except Exception:
        return None


def read_device(index: int = 0) -> DeviceInfo:
    """The local CUDA device (needs a GPU)."""
    import torch

    return device_info(torch.cuda.get_device_properties(index), index, _smem_per_block_optin(index))


@dataclass(frozen=True)
class DevicePeak:
    """A GPU's dense bf16 tensor-core peak (fp32 accumulate, whole GPU) and where the figure comes from."""

    tflops: float
    source: str


# Keyed by the name torch.cuda.get_device_properties reports. The figures are the spec sheet's dense bf16
# peaks, not measured ceilings: a user can look them up and check them, they do not move with clocks,
# driver or the benchmark that measured them, and they are the same kind of figure as the targets' peaks,
# so native and emulated utilizations are the same ratio. The spec figure is not reachable: our measured
# bf16 matmul ceiling on an H200 is about 790 TFLOPS (80 % of 989.4), and emulated SM120 kernels use
# mma.sync, which on Hopper runs below wgmma's rate, so an emulated run on an H200 reads low, never high.
DEVICE_PEAKS: dict[str, DevicePeak] = {
    # GH100 at its 1830 MHz boost, 132 SMs: the datasheets list 1,979 TFLOPS bf16 with sparsity, dense is half.
    "NVIDIA H100 80GB HBM3": DevicePeak(989.4, "H100 SXM dense bf16 tensor peak (NVIDIA H100 datasheet: 1,979 with sparsity, dense is half)"),
    "NVIDIA H200": DevicePeak(989.4, "H200 SXM dense bf16 tensor peak (NVIDIA H200 datasheet: 1,979 with sparsity, dense is half)"),
    "NVIDIA GeForce RTX 5090": DevicePeak(TARGETS["sm120"].peak_tflops_bf16, TARGETS["sm120"].peak_source),
    # The Max-Q and Server editions run other clocks: unknown until someone looks their figures up.
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": DevicePeak(
        TARGETS["sm120-pro6000"].peak_tflops_bf16, TARGETS["sm120-pro6000"].peak_source),
}


# Memory bandwidth (bytes per second) by the name torch reports: the spec sheets' figures, which no kernel reaches,
# so a floor made from them errs low (memory_floor.py). A CUDA GPU not listed gets UNKNOWN_GPU_BANDWIDTH, above any
# single GPU's today (B200: 8 TB/s).
DEVICE_MEMORY_BANDWIDTH: dict[str, float] = {
    "NVIDIA H100 80GB HBM3": 3.35e12,  # H100 SXM datasheet
    "NVIDIA H100 PCIe": 2.0e12,
    "NVIDIA H200": 4.8e12,  # H200 SXM datasheet
    "NVIDIA GeForce RTX 5090": 1.792e12,  # 512-bit GDDR7 at 28 Gbps
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": 1.792e12,
}
UNKNOWN_GPU_BANDWIDTH = 10e12


def device_bandwidth(name: str) -> float:
    """Bytes per second the GPU torch calls `name` can move at most (DEVICE_MEMORY_BANDWIDTH, else the unknown GPU's)."""
    return DEVICE_MEMORY_BANDWIDTH.get(name.strip(), UNKNOWN_GPU_BANDWIDTH)


def device_peak(name: str) -> DevicePeak | None:
    """The dense bf16 peak of the GPU torch calls `name`; None when DEVICE_PEAKS does not know it."""
    return DEVICE_PEAKS.get(name.strip())


def target_capability(target: Target) -> tuple[int, int]:
    """Compute capability of a target, from its arch name ('sm_120' -> (12, 0))."""
    digits = target.arch.removeprefix("sm_").rstrip("af")
    return int(digits[:-1]), int(digits[-1])


def select_mode(device: DeviceInfo, target: Target) -> str:
    """'native' when the device is the target's arch, 'emulated' on other SM80+ GPUs, else 'unsupported'."""
    if tuple(device.capability) == target_capability(target):
        return NATIVE
    if tuple(device.capability) >= MIN_EMULATION_CAPABILITY:
        return EMULATED
    return UNSUPPORTED


def emulation_env(device: DeviceInfo, target: Target, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment that makes upstream build the target's classes for this device, with its SM count."""
    env = dict(os.environ if base is None else base)
    env.pop("CUTE_DSL_ARCH", None)  # a cross-compile target would produce kernels this GPU cannot run
    env["FLASH_ATTENTION_ARCH"] = target.arch
    env["FLASH_ATTENTION_NUM_SMS"] = str(device.num_sms)
    return env


def device_own_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment with no arch override: FA4 picks this device's own kernels (SM90 on an H200)."""
    env = dict(os.environ if base is None else base)
    for name in ARCH_VARIABLES:
        env.pop(name, None)
    return env


def kernel_env(device: DeviceInfo, target: Target, mode: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for running the target's kernels in `mode` (native needs no override)."""
    if mode == EMULATED:
        return emulation_env(device, target, base)
    return device_own_env(base)


def run_label(target: Target, device_name: str, mode: str) -> str:
    """The tag every output line and record carries: 'target=sm120 device=NVIDIA H200 mode=emulated'."""
    return f"target={target.name} device={device_name} mode={mode}"


# ------------------------------------------------------------------------------------------------
# Clocks and temperature, read at the start and end of a run (a throttling GPU explains slow runs).
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Clocks:
    """SM and memory clocks (MHz), temperature (C) and power (W); None where unknown."""

    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    source: str = "unknown"

    def short(self) -> str:
        """One line for logs, e.g. 'sm 1980 MHz, mem 3201 MHz, 45 C, 310 W (nvidia-smi)'."""
        if self.source == "unknown":
            return "clocks unknown"

        def part(value, unit):
            return "?" if value is None else f"{value:.0f} {unit}"

        return (
            f"sm {part(self.sm_clock_mhz, 'MHz')}, mem {part(self.memory_clock_mhz, 'MHz')}, "
            f"{part(self.temperature_c, 'C')}, {part(self.power_w, 'W')} ({self.source})"
        )


NVIDIA_SMI_QUERY = "clocks.sm,clocks.mem,temperature.gpu,power.draw"


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse_nvidia_smi(line: str) -> Clocks:
    """Clocks from one line of `nvidia-smi --query-gpu=<NVIDIA_SMI_QUERY> --format=csv,noheader,nounits`."""
    values = [_number(part) for part in line.strip().split(",")]
    values += [None] * (4 - len(values))
    return Clocks(*values[:4], source="nvidia-smi")


def _read_nvml(nvml, index: int) -> Clocks:
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        return Clocks(
            sm_clock_mhz=nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            memory_clock_mhz=nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
            temperature_c=nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            power_w=nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            source="nvml",
        )
    finally:
        nvml.nvmlShutdown()


def read_clocks(index: int = 0, *, nvml: Any = None, run: Callable = subprocess.run) -> Clocks:
    """Clocks now: through pynvml if importable, else `nvidia-smi`, else all unknown (never raises)."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            nvml = None
    if nvml is not None:
        try:
            return _read_nvml(nvml, index)
        except Exception:
            pass
    try:
        done = run(
            ["nvidia-smi", f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits", "-i", str(index)],
            capture_output=True, text=True, timeout=20,
        )
        if done.returncode == 0 and done.stdout.strip():
            return parse_nvidia_smi(done.stdout.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError):
        pass
    return Clocks()
