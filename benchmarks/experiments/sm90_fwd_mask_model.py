"""A model of flash_fwd_sm90.cu's score mask for the right-diagonal form that
sm90_fwd_short_tiles.patch and sm90_fwd_short_tiles_unaligned.patch give it: for every thread of a
consumer warpgroup pair (row0 = 64 c + 16 warp + lane / 4, quad = lane % 4; score 4 i + 2 r + e is
row row0 + 8 r, key n_start + 8 i + 2 quad + e), the set of scores the general mask sets to -inf
(both window bounds and the key count, per row) against the right-diagonal form (one comparison
8 j + e >= lim shared by score j of row 0 and score j + 1 of row 1), over random blocks where the
patch takes that form (no left window bound, a right one, the block inside the keys).

    python3 benchmarks/experiments/sm90_fwd_mask_model.py [TRIALS]
"""
import random
import sys


def general(m_start, row0, quad, n_start, seqlen_k, diag, wr, wl, block_n):
    """The kernel's general mask: per row, keys outside [left, right)."""
    out = set()
    for r in range(2):
        row = m_start + row0 + 8 * r
        right = seqlen_k if wr < 0 else min(seqlen_k, row + diag + wr + 1)
        left = -2**31 if wl < 0 else row + diag - wl
        for i in range(block_n // 8):
            for e in range(2):
                key = n_start + 8 * i + 2 * quad + e
                if key >= right or key < left:
                    out.add(4 * i + 2 * r + e)
    return out


def right_only(m_start, row0, quad, n_start, diag, wr, block_n):
    """The patch's form: key >= row + diag + wr + 1, one comparison for two scores."""
    out = set()
    lim = m_start + row0 + diag + wr + 1 - n_start - 2 * quad
    for j in range(-1, block_n // 8):
        for e in range(2):
            if 8 * j + e >= lim:
                if j >= 0:
                    out.add(4 * j + e)
                if j + 1 < block_n // 8:
                    out.add(4 * (j + 1) + 2 + e)
    return out


def main():
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    random.seed(1)
    checked = 0
    for _ in range(trials):
        block_n, block_m = random.choice([64, 80, 128]), 128
        seqlen_q, seqlen_k = random.randint(1, 3000), random.randint(1, 3000)
        diag = random.choice([0, seqlen_k - seqlen_q])  # top-left or bottom-right alignment
        wr = random.choice([0, 0, 0, random.randint(0, 600)])
        m_start = random.randrange(0, seqlen_q, block_m)
        n_start = random.randrange(0, (seqlen_k + block_n - 1) // block_n) * block_n
        if n_start + block_n > seqlen_k:
            continue  # (the patch keeps the general mask where the keys end inside the block)
        for c in range(2):
            for warp in range(4):
                for lane in range(32):
                    row0, quad = 64 * c + 16 * warp + lane // 4, lane % 4
                    a = general(m_start, row0, quad, n_start, seqlen_k, diag, wr, -1, block_n)
                    b = right_only(m_start, row0, quad, n_start, diag, wr, block_n)
                    assert a == b, (block_n, seqlen_q, seqlen_k, diag, wr, m_start, n_start, row0, quad, a ^ b)
                    checked += 1
    print(f"right-diagonal mask: {checked} threads agree with the general mask")


if __name__ == "__main__":
    main()
