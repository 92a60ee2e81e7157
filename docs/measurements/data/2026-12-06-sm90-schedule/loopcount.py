"""Scratch: the record's count.py/loops2.py logic (docs/measurements/data/2026-12-06-fp16-sass) on any SASS files.
  python3 loopcount.py builds/X.sass [builds/Y.sass ...]   (prints totals, main loops (>=64 HMMA, backward branch), S2R TID)"""
import re, sys, collections
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "2026-12-06-fp16-sass"))
from count import parse, opcode
def mainloops(path):
    ins = parse(path); res = []
    for a, i in ins:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", i)
        if m and int(m.group(1), 16) < a and (i.startswith("@") or "BRA.U" in i):
            t = int(m.group(1), 16)
            body = [x for x in ins if t <= x[0] <= a]
            if sum("HMMA" in x for _, x in body) >= 64: res.append((t, a, body))
    return ins, res
def summary(path):
    ins, loops = mainloops(path)
    tid = sum(1 for _, i in ins if re.search(r"S2R.*SR_TID", i))
    loop_tid = [sum(1 for _, i in b if re.search(r"S2R.*SR_TID", i)) for _, _, b in loops]
    hm = sum("HMMA" in i for _, i in ins); f2 = sum(opcode(i).startswith("F2FP") for _, i in ins)
    loopinfo = [(hex(t), len(b), sum("HMMA" in x for _, x in b)) for t, _, b in loops]
    return dict(total=len(ins), loops=loopinfo, s2r_tid=tid, loop_tid=loop_tid, hmma=hm, f2fp=f2,
                isetp=[sum(opcode(x).startswith("ISETP") for _, x in b) for _, _, b in loops],
                lds=[sum(opcode(x).startswith("LDSM") for _, x in b) for _, _, b in loops])
if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(Path(p).stem, summary(p))
