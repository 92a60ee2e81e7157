"""A one-off check of the TMA classes' window loop (kernels/tma_forward_sm120.py mainloop, 2026-12-07 s13) in plain
Python: upstream b40 BlockInfo's block bounds copied as arithmetic, our loop's schedule replayed per query tile on 400
random shapes (tiles 64/128 x 32-128, sq <= sk, GQA packing 1-4, windows 0-500 left, some with a right side). It
asserts: the blocks run are consecutive, descending, none below 0; every block with a visible key is run; every block
run unmasked is wholly visible to every row of the tile and inside seqlen_k. Printed: "cases 400 bad 0".

    python3 docs/measurements/data/2026-12-07-local-schedule-sim.py
"""
import random
def cdiv(a,b): return -(-a//b)
def sim(sq, sk, tm, tn, wl, wr, causal, qh=1):
    # upstream BlockInfo formulas (b40), is_local = not causal-only
    is_local = not causal
    res_ok = True
    for m_block in range(cdiv(sq*qh, tm)):
        n_block_max = cdiv(sk, tn)
        if causal or (is_local and wr is not None):
            m_idx_max = (m_block+1)*tm
            if qh>1: m_idx_max = cdiv(m_idx_max, qh)
            n_idx = m_idx_max + sk - sq
            n_idx_right = n_idx if causal else n_idx + wr
            n_block_max = min(n_block_max, cdiv(n_idx_right, tn))
        n_block_min = 0
        if is_local and wl is not None:
            m_idx_min = m_block*tm
            if qh>1: m_idx_min //= qh
            n_idx = m_idx_min + sk - sq
            n_block_min = max((n_idx - wl)//tn, 0)
        # causal-local mask bound
        m_idx_min = m_block*tm
        if qh>1: m_idx_min //= qh
        n_idx = m_idx_min + sk - sq
        n_idx_right = n_idx if (not is_local or wr is None) else n_idx + wr
        nbm_cl = max(n_block_min, n_idx_right//tn)
        # before local mask
        if not is_local or wl is None: before = n_block_min
        else:
            mm = (m_block+1)*tm
            if qh>1: mm = cdiv(mm, qh)
            before = max(n_block_min, cdiv(mm + sk - sq - wl, tn))
        # our loop
        seq = []  # (block, masked)
        n_block = max(n_block_max-1, 0)
        seq.append((n_block, True))
        for t in range(n_block_max - 1 - nbm_cl):
            n_block = n_block_max - 2 - t; seq.append((n_block, True))
        if is_local and wl is not None:
            for t in range(max(n_block - before, 0)): seq.append((n_block - t - 1, False))
            left = min(n_block, before)
            for t in range(left - n_block_min): seq.append((left - t - 1, True))
        else:
            for t in range(n_block): seq.append((n_block - t - 1, False))
        blocks = [b for b,_ in seq]
        # visibility
        rows = [r for r in range(m_block*tm, (m_block+1)*tm)]
        rows = [r//qh for r in rows if r//qh < sq]
        def visible(r, c):
            d = c - (r + sk - sq)
            if causal: return d <= 0
            ok = True
            if wl is not None: ok &= d >= -wl
            if wr is not None: ok &= d <= wr
            return ok
        need = set(c//tn for r in rows for c in range(sk) if visible(r,c))
        if not rows: continue
        if not need.issubset(set(blocks)): print('MISSING', sq,sk,tm,tn,wl,wr,causal,qh,m_block, sorted(need-set(blocks))); res_ok=False
        if blocks != sorted(set(blocks), reverse=True) or (blocks and blocks != list(range(blocks[0], blocks[0]-len(blocks), -1))):
            print('ORDER', sq,sk,tm,tn,wl,wr,causal,m_block,blocks); res_ok=False
        if blocks and min(blocks) < 0: print('NEG', blocks); res_ok=False
        for b, masked in seq:
            if masked: continue
            for r in rows:
                for c in range(b*tn, min((b+1)*tn, sk)):
                    if not visible(r,c): print('UNMASKED-INVISIBLE', sq,sk,tm,tn,wl,wr,causal,qh,m_block,b,r,c); return False
            if (b+1)*tn > sk: print('UNMASKED-PAST-SK'); return False
        extra = set(blocks) - need
        # extra blocks fine (masked fully) but count
    return res_ok
random.seed(0)
bad = 0; n=0
for _ in range(400):
    tm = random.choice([64,128]); tn = random.choice([32,64,96,128])
    sq = random.randint(1, 700); sk = random.randint(sq, 1400) if random.random()<0.7 else sq
    qh = random.choice([1,1,2,4])
    if random.random() < 0.8: wl, wr, causal = random.choice([0,1,63,64,100,128,500]), 0, False   # causal window: local with wr=0
    else: wl, wr, causal = random.choice([0, 50, 100]), random.choice([0, 32, 50]), False
    n += 1
    if not sim(sq, sk, tm, tn, wl, wr, causal, qh): bad += 1
print('cases', n, 'bad', bad)
