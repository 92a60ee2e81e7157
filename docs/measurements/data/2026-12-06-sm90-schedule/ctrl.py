"""Scratch: the control words of the SASS (Volta+ encoding: high 64-bit word bits 41-44 stall, 45 yield, 46-48 write
barrier, 49-51 read barrier, 52-57 wait mask, 58-61 reuse) summed over each main loop: static stall cycles, and the
instructions that wait on a scoreboard barrier.   python3 ctrl.py builds/X.sass ..."""
import re, sys, collections
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent)); from loopcount import mainloops
ADDR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]{16}) \*/")
HI = re.compile(r"^\s*/\* (0x[0-9a-f]{16}) \*/\s*$")
def ctrl(path):
    lines = Path(path).read_text().splitlines(); out = {}
    for k, l in enumerate(lines):
        m = ADDR.search(l)
        if m and k + 1 < len(lines):
            h = HI.match(lines[k + 1])
            if h:
                w = int(h.group(1), 16) >> 41
                out[int(m.group(1), 16)] = dict(stall=w & 0xf, yld=(w >> 4) & 1, wr=(w >> 5) & 7, rd=(w >> 8) & 7, wait=(w >> 11) & 0x3f)
    return out
def main():
  for p in sys.argv[1:]:
      c = ctrl(p); ins, loops = mainloops(p); res = []
      for t, a, body in loops:
          st = sum(c[x][ "stall"] for x, _ in body if x in c)
          waits = sum(1 for x, _ in body if x in c and c[x]["wait"])
          res.append(f"loop {hex(t)} n={len(body)} stall_cycles={st} waiting={waits}")
      print(Path(p).stem, "; ".join(res))
if __name__ == '__main__':
    main()
