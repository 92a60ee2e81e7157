"""Scratch: in each main loop, for each LDSM the number of instructions (and static stall cycles) until the first
instruction that reads one of its destination registers; and the order of opcodes, compressed."""
import re, sys, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent)); from loopcount import mainloops, opcode
from ctrl import ctrl
def regs_of_dest(ins):
    m = re.match(r"(?:@!?\S+\s+)?LDSM\S*\s+R(\d+),", ins)
    n = 4 if ".4" in ins.split()[0 if not ins.startswith("@") else 1] else 2
    return {f"R{int(m.group(1)) + k}" for k in range(n)}
def reads(ins, regs):
    ops = ins.split(None, 2)[-1] if ins.startswith("@") else ins.split(None, 1)[-1]
    parts = ops.split(",")[1:]  # sources after the destination
    toks = set(re.findall(r"R\d+", ",".join(parts)))
    # HMMA operands R_a..R_a+3 are ranges: expand register pairs/quads by base
    if opcode(ins).startswith("HMMA"):
        srcs = re.findall(r"R(\d+)", ",".join(parts)); exp = set()
        for i, s in enumerate(srcs[:3]):
            w = 4 if i == 0 else 2
            exp |= {f"R{int(s) + k}" for k in range(w)}
        toks |= exp
    return bool(toks & regs)
for p in sys.argv[1:]:
    c = ctrl(p); _, loops = mainloops(p)
    out = []
    for t, a, body in loops:
        d_ins, d_cyc = [], []
        for k, (addr, ins) in enumerate(body):
            if opcode(ins).startswith("LDSM"):
                regs = regs_of_dest(ins); cyc = 0
                for j in range(k + 1, len(body)):
                    cyc += c[body[j - 1][0]]["stall"]
                    if reads(body[j][1], regs):
                        d_ins.append(j - k); d_cyc.append(cyc); break
        out.append(f"loop {hex(t)}: LDSM {len(d_ins)} to-use median {statistics.median(d_ins)} ins / {statistics.median(d_cyc)} cyc, min {min(d_ins)}, <=8 ins: {sum(x <= 8 for x in d_ins)}")
    print(p.split('/')[-1][:-5], " | ".join(out))
