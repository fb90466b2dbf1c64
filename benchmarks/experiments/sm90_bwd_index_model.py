"""A numpy model of one CTA step of flash_bwd_sm90_kernel's consumers (the index paths of the .cu,
line for line: TMA's 128-byte swizzle, the wgmma descriptors' addressing, the accumulator and A
fragment layouts, stmatrix, the dq chunk permutation, the convert), in float64, against the direct
formulas. Run for D = 128 (the kernel proven on the GPU: validates the model) and D = 64."""
import numpy as np, sys

LOG2E = 1.4426950408889634

def swz(a):  # the 128-byte swizzle of a byte offset from a 1024-aligned base
    return a ^ (((a >> 7) & 7) << 4)

def dq_col(row, col):
    key = ((row & 3) << 1) | ((row >> 2) & 1)
    return (((col >> 2) ^ key) << 2) | (col & 3)

class Cfg:
    def __init__(s, D):
        s.D = D; s.N = 128; s.M = 128 if D == 64 else 64; s.stages = 2; s.slabs = D // 64
        s.by_q = D == 64; s.row0 = 64 if s.by_q else 0; s.col0 = 0 if s.by_q else 64
        s.slabKV = s.N * 128; s.tileKV = s.slabs * s.slabKV
        s.slabQ = s.M * 128; s.tileQ = s.slabs * s.slabQ
        s.slabDs = s.M * 128; s.tileDs = (s.N // 64) * s.slabDs
        s.tileDq = s.M * D * 4
        s.statsSlot = s.M + 4; s.statsFloats = 2 * s.statsSlot
        s.offK = 0; s.offV = s.tileKV; s.offQ = 2 * s.tileKV; s.offDo = s.offQ + s.stages * s.tileQ
        s.offDs = s.offDo + s.stages * s.tileQ; s.offDq = s.offDs + s.tileDs; s.offStats = s.offDq + s.tileDq
        s.offBars = s.offStats + s.stages * s.statsFloats * 4; s.smem = s.offBars + 64 + 1024

def run(D, seqlen_q, seqlen_k, n_start, m_block, stage, wl=-1, wr=-1, softcap=0.0, shift=0, seed=0, diag=None):
    C = Cfg(D); rng = np.random.default_rng(seed)
    M, N = C.M, C.N
    m_start = m_block * M
    if diag is None: diag = seqlen_k - seqlen_q
    scale = 1.0 / np.sqrt(D)
    # global tensors of one head: rows × D (rows past the tensor: TMA zeros)
    Q = rng.standard_normal((seqlen_q, D)); dO = rng.standard_normal((seqlen_q, D))
    K = rng.standard_normal((seqlen_k, D)); V = rng.standard_normal((seqlen_k, D))
    lse2 = rng.standard_normal(seqlen_q) + 3.0; dsum = rng.standard_normal(seqlen_q)
    mem = np.full(C.smem // 2, np.nan)      # 16-bit slots, by byte offset / 2
    mem32 = np.full(C.smem // 4, np.nan)    # fp32 slots, by byte offset / 4
    def tma_load(dst, G, row0, rows, col0):
        for r in range(rows):
            for c in range(64):
                g = row0 + r
                mem[swz(dst + r * 128 + c * 2) // 2] = G[g, col0 + c] if 0 <= g < G.shape[0] else 0.0
    for slab in range(C.slabs):
        tma_load(C.offK + slab * C.slabKV, K, n_start, N, 64 * slab)
        tma_load(C.offV + slab * C.slabKV, V, n_start, N, 64 * slab)
        tma_load(C.offQ + stage * C.tileQ + slab * C.slabQ, Q, m_start, M, 64 * slab)
        tma_load(C.offDo + stage * C.tileQ + slab * C.slabQ, dO, m_start, M, 64 * slab)
    st = C.offStats // 4 + stage * C.statsFloats
    for q in range(M):  # rows past the sequence: whatever the stage held
        mem32[st + shift + q] = lse2[m_start + q] if m_start + q < seqlen_q else np.nan
        mem32[st + C.statsSlot + shift + q] = dsum[m_start + q] if m_start + q < seqlen_q else np.nan
    # wgmma operand reads (descriptor start = byte offset)
    def kmajor(start, rows):  # rows × 16, K-major, SBO 1024
        return np.array([[mem[swz(start + (m // 8) * 1024 + (m % 8) * 128 + 2 * k) // 2] for k in range(16)]
                         for m in range(rows)])
    def mnmajor(start, n, lbo):  # 16 × n, MN-major, SBO 1024
        return np.array([[mem[swz(start + (j // 64) * lbo + (k // 8) * 1024 + (k % 8) * 128 + 2 * (j % 64)) // 2]
                          for j in range(n)] for k in range(16)])
    def acc_of(Mat, w, lane):  # accumulator registers of thread (warp w, lane) of a 64 × n result
        n = Mat.shape[1]; out = np.zeros(n // 2)
        for i in range(n // 8):
            for r in range(2):
                for e in range(2):
                    out[4 * i + 2 * r + e] = Mat[16 * w + lane // 4 + 8 * r, 8 * i + 2 * (lane % 4) + e]
        return out
    def a_matrix(frag):  # frag[w][lane] = 4 registers × 2 values → the 64 × 16 A of a k16 step
        A = np.zeros((64, 16))
        for w in range(4):
            for lane in range(32):
                g, t = lane // 4, lane % 4; a = frag[w][lane]
                A[16 * w + g, 2 * t:2 * t + 2] = a[0]; A[16 * w + g + 8, 2 * t:2 * t + 2] = a[1]
                A[16 * w + g, 8 + 2 * t:8 + 2 * t + 2] = a[2]; A[16 * w + g + 8, 8 + 2 * t:8 + 2 * t + 2] = a[3]
        return A
    window_left = wl; softcap_on = softcap > 0
    score_scale = (softcap if softcap_on else scale) * LOG2E
    cap_scale = scale / softcap if softcap_on else 0.0
    q_tile = C.offQ + stage * C.tileQ; do_tile = C.offDo + stage * C.tileQ
    regs = {}
    for c in range(2):
        desc_k_rows = C.offK + 64 * 128 * c; desc_v_rows = C.offV + 64 * 128 * c
        S = np.zeros((64, M)); dP = np.zeros((64, M))
        for kk in range(D // 16):
            ins = 32 * (kk % 4)
            A = kmajor(desc_k_rows + (kk // 4) * C.slabKV + ins, 64); B = kmajor(q_tile + (kk // 4) * C.slabQ + ins, M)
            S += A @ B.T
            A = kmajor(desc_v_rows + (kk // 4) * C.slabKV + ins, 64); B = kmajor(do_tile + (kk // 4) * C.slabQ + ins, M)
            dP += A @ B.T
        masked = (wr >= 0 and n_start + N - 1 > m_start + diag + wr) or \
                 (window_left >= 0 and n_start < m_start + M - 1 + diag - window_left) or n_start + N > seqlen_k
        tail = m_start + M > seqlen_q
        for w in range(4):
            for lane in range(32):
                quad = lane % 4; key0 = 64 * c + 16 * w + lane // 4
                s = acc_of(S, w, lane); dp = acc_of(dP, w, lane)
                if softcap_on: s = np.tanh(s * cap_scale)
                origin = m_start + 2 * quad if C.by_q else 0
                m_rel = m_start - origin; seq_end = seqlen_q - origin
                q_lo = [-2**31, -2**31]; q_hi = [2**31 - 1, 2**31 - 1]
                if masked:
                    for r in range(2):
                        key = n_start + key0 + 8 * r
                        if wr >= 0: q_lo[r] = key - diag - wr - origin
                        if window_left >= 0: q_hi[r] = key - diag + window_left + 1 - origin
                        if key >= seqlen_k: q_hi[r] = -2**31
                lse = mem32[st + shift:]; ds_ = mem32[st + C.statsSlot + shift:]
                p16 = np.zeros((M // 8, 2, 2)); ds16 = np.zeros((M // 8, 2, 2))
                for i in range(M // 8):
                    l2 = [lse[8 * i + 2 * quad], lse[8 * i + 2 * quad + 1]]
                    if tail:
                        qq = m_rel + 8 * i + 2 * quad
                        if qq >= seq_end: l2[0] = np.inf
                        if qq + 1 >= seq_end: l2[1] = np.inf
                    for r in range(2):
                        for e in range(2):
                            idx = 4 * i + 2 * r + e
                            with np.errstate(invalid='ignore'):
                                pe = np.exp2(s[idx] * score_scale - l2[e])
                            if masked:
                                qq = m_rel + 8 * i + 2 * quad + e
                                if qq < q_lo[r] or qq >= q_hi[r]: pe = 0.0
                            p16[i, r, e] = pe
                            s[idx] = pe * (1 - s[idx] * s[idx]) if softcap_on else pe
                    dd = [ds_[8 * i + 2 * quad], ds_[8 * i + 2 * quad + 1]]
                    if tail:
                        qq = m_rel + 8 * i + 2 * quad
                        if qq >= seq_end: dd[0] = 0.0
                        if qq + 1 >= seq_end: dd[1] = 0.0
                    for r in range(2):
                        idx = 4 * i + 2 * r
                        ds16[i, r] = [s[idx] * (dp[idx] - dd[0]), s[idx + 1] * (dp[idx + 1] - dd[1])]
                regs[c, w, lane] = dict(p16=p16, ds16=ds16)
        # dS → shared memory by stmatrix.trans (the kernel's addresses are physical)
        for w in range(4):
            for t in range(M // 16):
                mats = []
                for m in range(4):  # register m: fragment (2 t + m / 2, r = m % 2)
                    Mx = np.zeros((8, 8))
                    for lane in range(32):
                        v = regs[c, w, lane]['ds16'][2 * t + m // 2, m % 2]
                        Mx[lane // 4, 2 * (lane % 4):2 * (lane % 4) + 2] = v
                    mats.append(Mx)
                for lane in range(32):
                    m, jj = lane // 8, lane % 8
                    row = C.offDs + c * C.slabDs + (8 * (m // 2) + jj) * 128 + (((2 * w + m % 2) ^ jj) << 4) + t * 16 * 128
                    for x in range(8):
                        mem[(row + 2 * x) // 2] = mats[m][x, jj]  # .trans: row jj gets column jj
    out = {}
    for c in range(2):
        # dV, dK (RS, B MN-major n = D)
        dV = np.zeros((64, D)); dK = np.zeros((64, D))
        for kk in range(M // 16):
            fr = [[[regs[c, w, l]['p16'][2 * kk, 0], regs[c, w, l]['p16'][2 * kk, 1], regs[c, w, l]['p16'][2 * kk + 1, 0],
                    regs[c, w, l]['p16'][2 * kk + 1, 1]] for l in range(32)] for w in range(4)]
            dV += a_matrix(fr) @ mnmajor(do_tile + 2048 * kk, D, C.slabQ)
            fr = [[[regs[c, w, l]['ds16'][2 * kk, 0], regs[c, w, l]['ds16'][2 * kk, 1], regs[c, w, l]['ds16'][2 * kk + 1, 0],
                    regs[c, w, l]['ds16'][2 * kk + 1, 1]] for l in range(32)] for w in range(4)]
            dK += a_matrix(fr) @ mnmajor(q_tile + 2048 * kk, D, C.slabQ)
        # dQ (SS: A dS K-major from dq_row0, B K MN-major from slab dq_col0 / 64)
        dq_row0, dq_col0 = C.row0 * c, C.col0 * c
        desc_ds = C.offDs + dq_row0 * 128; desc_k_cols = C.offK + (dq_col0 // 64) * C.slabKV
        dQ = np.zeros((64, 64))
        for kk in range(N // 16):
            dQ += kmajor(desc_ds + (kk // 4) * C.slabDs + 32 * (kk % 4), 64) @ mnmajor(desc_k_cols + 2048 * kk, 64, C.slabKV)
        for w in range(4):
            for lane in range(32):
                dq = acc_of(dQ, w, lane); quad = lane % 4
                for i in range(8):
                    for r in range(2):
                        row = dq_row0 + 16 * w + lane // 4 + 8 * r; col = dq_col0 + 8 * i + 2 * quad
                        at = C.offDq // 4 + row * D + dq_col(row, col)
                        mem32[at] = dq[4 * i + 2 * r]; mem32[at + 1] = dq[4 * i + 2 * r + 1]
        out[c] = (dV, dK)
    # the bulk add copies the tile byte for byte; the convert un-permutes
    tile = mem32[C.offDq // 4: C.offDq // 4 + M * D].copy()
    dq_got = np.full((M, D), np.nan)
    for pair in range(M * D // 2):
        row, col = pair // (D // 2), 2 * (pair % (D // 2))
        dq_got[row, col] = tile[row * D + dq_col(row, col)]; dq_got[row, col + 1] = tile[row * D + dq_col(row, col) + 1]
    # dK · scale and dV out by stmatrix into Q's / dO's stages, then the TMA stores of 64-row boxes
    dk_got = np.full((N, D), np.nan); dv_got = np.full((N, D), np.nan)
    slab_out = 64 * 128
    for c in range(2):
        outb = C.offQ + c * C.stages * C.tileQ
        for w in range(4):
            for lane in range(32):
                pass
        # registers of dK / dV in the accumulator layout
        dV, dK = out[c]
        for w in range(4):
            for i in range(0, D // 8, 2):
                mk = []; mv = []
                for m in range(4):  # (i, r=0), (i, r=1), (i+1, r=0), (i+1, r=1)
                    ii, r = i + m // 2, m % 2
                    Mk = np.zeros((8, 8)); Mv = np.zeros((8, 8))
                    for lane in range(32):
                        ak = acc_of(dK, w, lane) * scale; av = acc_of(dV, w, lane)
                        Mk[lane // 4, 2 * (lane % 4):2 * (lane % 4) + 2] = ak[4 * ii + 2 * r:4 * ii + 2 * r + 2]
                        Mv[lane // 4, 2 * (lane % 4):2 * (lane % 4) + 2] = av[4 * ii + 2 * r:4 * ii + 2 * r + 2]
                    mk.append(Mk); mv.append(Mv)
                for lane in range(32):
                    m, jj = lane // 8, lane % 8; row = 16 * w + 8 * (m % 2) + jj; chunk = i + m // 2
                    at = outb + (chunk // 8) * slab_out + row * 128 + (((chunk % 8) ^ jj) << 4)
                    for x in range(8):
                        mem[(at + 2 * x) // 2] = mk[m][jj, x]
                        mem[(at + C.slabs * slab_out + 2 * x) // 2] = mv[m][jj, x]
        for slab in range(C.slabs):
            for r in range(64):
                for col in range(64):
                    dk_got[64 * c + r, 64 * slab + col] = mem[swz(outb + slab * slab_out + r * 128 + 2 * col) // 2]
                    dv_got[64 * c + r, 64 * slab + col] = mem[swz(outb + (C.slabs + slab) * slab_out + r * 128 + 2 * col) // 2]
    # the direct formulas over the block (queries m_start + [0, M), keys n_start + [0, N))
    qs = np.arange(m_start, m_start + M); ks = np.arange(n_start, n_start + N)
    Qb = np.array([Q[q] if q < seqlen_q else np.zeros(D) for q in qs]); dOb = np.array([dO[q] if q < seqlen_q else np.zeros(D) for q in qs])
    Kb = np.array([K[k] if k < seqlen_k else np.zeros(D) for k in ks]); Vb = np.array([V[k] if k < seqlen_k else np.zeros(D) for k in ks])
    raw = Kb @ Qb.T  # keys × queries
    t = np.tanh(raw * scale / softcap) if softcap_on else None
    sc = (softcap * t) if softcap_on else raw * scale
    l2b = np.array([lse2[q] if q < seqlen_q else np.inf for q in qs]); Db = np.array([dsum[q] if q < seqlen_q else 0 for q in qs])
    P = np.exp2(sc * LOG2E - l2b[None, :])
    vis = np.ones_like(P, bool)
    for a, k in enumerate(ks):
        for b, q in enumerate(qs):
            if k >= seqlen_k or q >= seqlen_q: vis[a, b] = False
            if wr >= 0 and k > q + diag + wr: vis[a, b] = False
            if wl >= 0 and k < q + diag - wl: vis[a, b] = False
    P = np.where(vis, P, 0.0)
    dPr = Vb @ dOb.T
    dS = P * (dPr - Db[None, :]) * ((1 - t * t) if softcap_on else 1.0)
    want_dv = P @ dOb; want_dk = dS @ Qb * scale; want_dq = dS.T @ Kb
    def err(a, b):
        return np.max(np.abs(a - b)) / max(1.0, np.max(np.abs(b)))
    res = dict(dv=err(dv_got, want_dv), dk=err(dk_got, want_dk), dq=err(dq_got, want_dq),
               nan=bool(np.isnan(dv_got).any() or np.isnan(dk_got).any() or np.isnan(dq_got).any()))
    return res

if __name__ == '__main__':
    # (m_row: the block's first query row, a multiple of 128 so that it is a block at both M)
    cases = [
        dict(seqlen_q=300, seqlen_k=257, n_start=128, m_row=128, stage=1),
        dict(seqlen_q=300, seqlen_k=257, n_start=128, m_row=256, stage=0),                     # query and key tails
        dict(seqlen_q=513, seqlen_k=513, n_start=128, m_row=128, stage=1, wr=0),               # causal, diagonal
        dict(seqlen_q=257, seqlen_k=513, n_start=256, m_row=0, stage=1, wr=0),                 # causal Sq != Sk
        dict(seqlen_q=600, seqlen_k=600, n_start=128, m_row=128, stage=0, wl=100, wr=50),      # window
        dict(seqlen_q=600, seqlen_k=600, n_start=256, m_row=128, stage=0, wl=100, wr=-1),      # left edge alone
        dict(seqlen_q=140, seqlen_k=140, n_start=0, m_row=128, stage=1, wr=0, wl=7, softcap=5.0),  # softcap, causal + left
        dict(seqlen_q=140, seqlen_k=140, n_start=0, m_row=0, stage=0, shift=3, softcap=5.0),   # varlen-like stats shift
        dict(seqlen_q=150, seqlen_k=70, n_start=0, m_row=128, stage=0, wr=0),                  # causal Sq > Sk
    ]
    for D in [int(a) for a in sys.argv[1:]] or [128, 64]:
        for cs in cases:
            cs = dict(cs); m_row = cs.pop('m_row'); M = Cfg(D).M
            for m_block in range(m_row // M, (m_row + 128) // M):  # the 128 rows at either M
                if m_block * M >= cs['seqlen_q']: continue
                r = run(D, m_block=m_block, **cs)
                print(D, m_block, cs, {k: (float(v) if k != 'nan' else v) for k, v in r.items()}, flush=True)
