import re, sys, collections
from pathlib import Path
LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
def parse(path):
    out = []
    for l in Path(path).read_text().splitlines():
        m = LINE.search(l)
        if not m: continue
        ins = m.group(2).strip()
        ins = re.sub(r"\s+&(wr|rd|req)=\S+", "", ins)
        ins = re.sub(r"\s+\?\S+$", "", ins)
        out.append((int(m.group(1), 16), re.sub(r"\s+", " ", ins)))
    return out
def opcode(ins):
    t = ins.split()
    if t[0].startswith("@"): t = t[1:]
    return t[0]
if __name__ == "__main__":
    for cfg in "ABU":
        c = {d: collections.Counter(opcode(i) for _, i in parse(f"{cfg}_{d}.sass")) for d in ("bf16", "fp16")}
        for d in ("bf16","fp16"):
            Path(f"{cfg}_{d}.clean").write_text("\n".join(f"{a:05x} {i}" for a, i in parse(f"{cfg}_{d}.sass")) + "\n")
        print(f"== {cfg}: total bf16 {sum(c['bf16'].values())} fp16 {sum(c['fp16'].values())}")
        keys = sorted(set(c["bf16"]) | set(c["fp16"]))
        for k in keys:
            if c["bf16"][k] != c["fp16"][k]:
                print(f"  {k:28s} {c['bf16'][k]:5d} {c['fp16'][k]:5d} {c['fp16'][k]-c['bf16'][k]:+5d}")
