"""Scratch: one table row per build in builds/ (regs/spills from the cubin via fa4tune.cubin, the rest from the SASS)."""
import os, re, sys, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4])); sys.path.insert(0, str(Path(__file__).resolve().parent))
from fa4tune.cubin import read_cubin
from loopcount import mainloops, opcode
from ctrl import ctrl
import ldsm_dist  # noqa (prints nothing without argv)
B = Path(os.environ.get("SCHEDULE_BUILDS", "/tmp/sm90-schedule/builds"))
print("| build | regs | spill st/ld B | SASS | loops masked / unmasked | S2R TID kernel / in loops | PTX %tid.x | unmasked loop static stall cycles / scoreboard waits | LDSM to first use, median ins (masked / unmasked) |")
print("|---|---|---|---|---|---|---|---|---|")
for s in sorted(B.glob("*.sass"), key=lambda p: (p.stem.split("_")[3:], p.stem)):
    f = read_cubin(s.with_suffix(".cubin").read_bytes() if False else str(s.with_suffix(".cubin"))) if False else None
    try: f = read_cubin(s.with_suffix(".cubin").read_bytes())
    except Exception: f = read_cubin(str(s.with_suffix(".cubin")))
    ins, loops = mainloops(s); c = ctrl(s)
    tid = sum(1 for _, i in ins if re.search(r"S2R.*SR_TID", i)); ltid = sum(1 for _, _, b in loops for _, i in b if re.search(r"S2R.*SR_TID", i))
    un = loops[-1][2]; st = sum(c[a]["stall"] for a, _ in un); wt = sum(1 for a, _ in un if c[a]["wait"])
    med = []
    for t, a, body in loops:
        d = []
        for k, (addr, i) in enumerate(body):
            if opcode(i).startswith("LDSM"):
                regs = ldsm_dist.regs_of_dest(i)
                for j in range(k + 1, len(body)):
                    if ldsm_dist.reads(body[j][1], regs): d.append(j - k); break
        med.append(statistics.median(d))
    ptx = s.with_suffix(".ptx").read_text().count("%tid.x")
    print(f"| {s.stem} | {f.registers} | {f.spill_store_bytes} / {f.spill_load_bytes} | {len(ins):,} | {len(loops[0][2])} / {len(un)} | {tid} / {ltid} | {ptx} | {st} / {wt} | {med[0]:g} / {med[1]:g} |")
