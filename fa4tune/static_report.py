"""The static check's table and grep-able metric lines."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fa4tune.targets import Target


def metric_lines(facts, target: Target) -> list[str]:
    """`name: value` lines for run.log (grep '^static_')."""
    ok = [f for f in facts if f.ok]
    lines = [
        f"static_configs_ok: {len(ok)}/{len(facts)}",
        f"static_max_registers: {max((f.registers for f in ok), default=0)}",
        f"static_spill_bytes: {sum(f.spill_store_bytes + f.spill_load_bytes for f in ok)}",
        f"static_kernels_spilling: {sum(1 for f in ok if f.spill_store_bytes or f.stack_bytes)}",
        f"static_min_occupancy: {min((f.occupancy for f in ok), default=0.0):.3f}",
        f"target: {target.name}",
        "mode: static",
    ]
    return lines


def print_report(jobs, facts, target: Target, console: Console | None = None) -> None:
    """Per-kernel table (registers, stack, spills, shared memory, occupancy), then the metric lines."""
    console = console or Console(width=200)
    table = Table(title=f"SM120 static check ({target.name}: {target.num_sms} SMs, {target.smem_per_block} B smem per block)")
    for column in ("dir", "problem class", "config", "status", "regs", "stack B", "spill st/ld B", "smem B", "blocks/SM", "occupancy", "limiter", "compile s"):
        table.add_column(column)
    for job, f in zip(jobs, facts):
        config = job.config.short()
        if f.ok:
            table.add_row(
                job.kind, job.problem_class.name, config, "ok", str(f.registers), str(f.stack_bytes),
                f"{f.spill_store_bytes}/{f.spill_load_bytes}", str(f.smem_bytes), str(f.blocks_per_sm),
                f"{f.occupancy:.1%}", f.occupancy_limiter, "cached" if f.cached else f"{f.compile_seconds:.1f}",
            )
        else:
            table.add_row(job.kind, job.problem_class.name, config, f"{f.status}: {f.reason}", *([""] * 8))
    console.print(table)
    console.print(
        f"per-SM limits ({target.name}, CUDA C++ Programming Guide, compute capability 12.0): "
        f"{target.max_threads_per_sm} threads, {target.max_blocks_per_sm} blocks, {target.registers_per_sm} registers "
        f"(allocated per warp in units of {target.register_alloc_unit}), {target.smem_per_sm} B shared memory "
        f"({target.smem_reserved_per_block} B reserved per block)",
        soft_wrap=True,
    )
    for line in metric_lines(facts, target):
        print(line, flush=True)
