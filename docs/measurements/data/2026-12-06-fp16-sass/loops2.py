import re, sys, collections
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
pre = sys.argv[1]
for cfg in "ABU":
    data = {d: mainloops(f"{pre}{cfg}_{d}.sass") for d in ("bf16","fp16")}
    tot = {d: collections.Counter(opcode(i) for _, i in data[d][0]) for d in data}
    print(f"== {pre}{cfg} whole kernel: bf16 {sum(tot['bf16'].values())} fp16 {sum(tot['fp16'].values())}; loops bf16 {[(hex(t),len(b)) for t,_,b in data['bf16'][1]]} fp16 {[(hex(t),len(b)) for t,_,b in data['fp16'][1]]}")
    for li in range(min(len(data['bf16'][1]), len(data['fp16'][1]))):
        c = {d: collections.Counter(opcode(i) for _, i in data[d][1][li][2]) for d in data}
        diff = [f"{k} {c['bf16'][k]}->{c['fp16'][k]}" for k in sorted(set(c['bf16'])|set(c['fp16'])) if c['bf16'][k]!=c['fp16'][k] and 'HMMA' not in k and 'F2FP' not in k]
        print(f"  loop{li+1}: bf16 {sum(c['bf16'].values())} fp16 {sum(c['fp16'].values())}: " + ", ".join(diff))
    print("  S2R TID whole kernel:", {d: sum(1 for _, i in data[d][0] if re.search(r'S2R.*SR_TID', i)) for d in data})
