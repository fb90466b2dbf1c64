"""The definition of correct for every flashext op: plain PyTorch in float64, readable.

Each function takes tensors of any float dtype on any device and returns float64 results.
The kernels are judged against these (tolerance rule: tests and flashext.testing).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBIC = 0.044715


def _f64(t: Tensor) -> Tensor:
    return t.to(torch.float64)


def _check_approximate(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")


def gelu(z: Tensor, approximate: str = "none") -> Tensor:
    """gelu(z) = z·Φ(z) = ½z(1 + erf(z/√2));  tanh form: ½z(1 + tanh(√(2/π)(z + 0.044715z³)))."""
    _check_approximate(approximate)
    z = _f64(z)
    if approximate == "tanh":
        u = SQRT_2_OVER_PI * (z + GELU_TANH_CUBIC * z**3)
        return 0.5 * z * (1.0 + torch.tanh(u))
    return 0.5 * z * (1.0 + torch.erf(z / math.sqrt(2.0)))


def gelu_grad(z: Tensor, approximate: str = "none") -> Tensor:
    """gelu'(z) = Φ(z) + z·φ(z);  tanh form: ½(1 + t) + ½z(1 − t²)·√(2/π)(1 + 3·0.044715z²)."""
    _check_approximate(approximate)
    z = _f64(z)
    if approximate == "tanh":
        u = SQRT_2_OVER_PI * (z + GELU_TANH_CUBIC * z**3)
        t = torch.tanh(u)
        du_dz = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH_CUBIC * z**2)
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * du_dz
    cdf = 0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))
    pdf = torch.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return cdf + z * pdf


def add_gelu(x: Tensor, y: Tensor, approximate: str = "none") -> Tensor:
    """gelu(x + y), the sum taken in float64 (no rounding between the add and the GeLU)."""
    return gelu(_f64(x) + _f64(y), approximate)


def add_gelu_backward(grad_out: Tensor, x: Tensor, y: Tensor, approximate: str = "none") -> Tensor:
    """d/dx = d/dy = grad_out · gelu'(x + y)."""
    return _f64(grad_out) * gelu_grad(_f64(x) + _f64(y), approximate)


def bias_gelu(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    """gelu(x + bias), bias broadcast over the last dimension."""
    return gelu(_f64(x) + _f64(bias), approximate)


def bias_gelu_backward(
    grad_out: Tensor, x: Tensor, bias: Tensor, approximate: str = "none"
) -> tuple[Tensor, Tensor]:
    """(grad_x, grad_bias): grad_x = grad_out · gelu'(x + bias), grad_bias = Σ_rows grad_x."""
    grad_x = _f64(grad_out) * gelu_grad(_f64(x) + _f64(bias), approximate)
    grad_bias = grad_x.reshape(-1, x.shape[-1]).sum(dim=0)
    return grad_x, grad_bias


# ---- attention ------------------------------------------------------------------------------
#
# Layout as flash-attn: q (B, Sq, H, D), k and v (B, Sk, Hkv, D) with H % Hkv == 0 (query head h
# reads key/value head h // (H / Hkv)). Causal masks and windows are aligned bottom-right: query
# row i sits at key column i + (Sk − Sq), so a KV cache longer than the queries lines up with
# its end. Key j is visible to query i when
#     i + (Sk − Sq) − left ≤ j ≤ i + (Sk − Sq) + right      (left/right = −1: unbounded),
# and causal is right = 0. Scores are s = q·kᵀ · softmax_scale, soft-capped to
# softcap · tanh(s / softcap) when softcap > 0. A query with no visible key outputs 0 and has
# log-sum-exp −inf (the logsumexp of an empty set).


def attention_mask(seqlen_q: int, seqlen_k: int, causal: bool = False,
                   window_size: tuple[int, int] = (-1, -1), device=None) -> Tensor:
    """Boolean (Sq, Sk) mask, True where query i may attend to key j (bottom-right aligned)."""
    left, right = window_size
    if causal:
        right = 0
    row = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)  # the diagonal
    col = torch.arange(seqlen_k, device=device)[None, :]
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        visible &= col >= row - left
    if right >= 0:
        visible &= col <= row + right
    return visible


def _heads_first(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float | None, dtype: torch.dtype):
    """q, k, v as (B, H, S, D) in `dtype`, each KV head repeated for its group of query heads,
    and the softmax scale (1/√D unless given)."""
    heads, heads_kv, head_dim = q.shape[2], k.shape[2], q.shape[3]
    if heads % heads_kv != 0:
        raise ValueError(f"heads {heads} is not a multiple of kv heads {heads_kv}")
    group = heads // heads_kv
    qf = q.to(dtype).transpose(1, 2)
    kf = k.to(dtype).repeat_interleave(group, dim=2).transpose(1, 2)
    vf = v.to(dtype).repeat_interleave(group, dim=2).transpose(1, 2)
    return qf, kf, vf, head_dim**-0.5 if softmax_scale is None else softmax_scale


def _safe_max(row_max: Tensor) -> Tensor:
    """The max to subtract before exp: 0 while a row has seen only −inf (exp(−inf − −inf) is NaN).
    The CUDA twin: safe_row_max in csrc/kernels/common/online_softmax.h."""
    return torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, softmax_scale: float | None = None,
              window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, return_lse: bool = False,
              compute_dtype: torch.dtype = torch.float64, mask: Tensor | None = None):
    """softmax(mask(cap(q·kᵀ·scale))) · v, materialising the (Sq, Sk) scores: the definition.

    Computed in `compute_dtype` (float64 by default; pass the inputs' dtype for "plain PyTorch
    in the same precision", the baseline of the tolerance rule). mask: an extra boolean mask
    broadcastable to (B, H, Sq, Sk), True where a key may be seen (block-sparse attention's).
    Returns out (B, Sq, H, D) in compute_dtype, and with return_lse also lse (B, H, Sq), natural log.
    """
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    qf, kf, vf, scale = _heads_first(q, k, v, softmax_scale, compute_dtype)  # (B, H, S, D)
    scores = (qf @ kf.transpose(-1, -2)) * scale  # S = Q Kᵀ · scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    visible = attention_mask(seqlen_q, seqlen_k, causal, window_size, device=q.device)
    if mask is not None:
        visible = visible & mask
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # −inf where a row sees no key
    any_visible = visible.any(dim=-1, keepdim=True)  # (…, Sq, 1): rows that see some key
    probs = torch.where(any_visible, torch.exp(scores - lse[..., None]), torch.zeros((), dtype=compute_dtype, device=q.device))
    out = (probs @ vf).transpose(1, 2)  # (B, Sq, H, D)
    return (out, lse.float()) if return_lse else out


def attention_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                       softmax_scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                       softcap: float = 0.0, dlse: Tensor | None = None,
                       compute_dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of attention() for the output gradient dout (B, Sq, H, D), and dlse (B, H, Sq)
    when its lse was used too: the definition of the backward, from the (Sq, Sk) probabilities P.

        dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − rowsum(P ∘ dP) + dlse)     (per query row)
        dscores = dS · scale · (1 − tanh²(s / softcap)) if soft-capped,  dQ = dscores K,  dK = dscoresᵀ Q

    with dK and dV of a KV head summed over its group of query heads. A query that sees no key has
    P = 0, so its gradients are 0 (autograd through attention()'s torch.where would give NaN there).
    """
    seqlen_q, seqlen_k, heads, heads_kv = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    qf, kf, vf, scale = _heads_first(q, k, v, softmax_scale, compute_dtype)  # (B, H, S, D)
    dof = dout.to(compute_dtype).transpose(1, 2)
    raw = (qf @ kf.transpose(-1, -2)) * scale
    scores = softcap * torch.tanh(raw / softcap) if softcap > 0 else raw
    visible = attention_mask(seqlen_q, seqlen_k, causal, window_size, device=q.device)
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.where(visible.any(dim=-1)[:, None], torch.exp(scores - _safe_max(lse)),
                        torch.zeros((), dtype=compute_dtype, device=q.device))
    dv = probs.transpose(-1, -2) @ dof
    dp = dof @ vf.transpose(-1, -2)
    ds = probs * (dp - (probs * dp).sum(dim=-1, keepdim=True))
    if dlse is not None:
        ds = ds + probs * dlse.to(compute_dtype)[..., None]
    if softcap > 0:
        ds = ds * (1 - torch.tanh(raw / softcap) ** 2)
    ds = ds * scale
    dq = ds @ kf
    dk = ds.transpose(-1, -2) @ qf
    group = heads // heads_kv

    def per_kv_head(t):  # (B, H, Sk, D) → (B, Sk, Hkv, D), summed over each group
        b, _, s, d = t.shape
        return t.reshape(b, heads_kv, group, s, d).sum(dim=2).transpose(1, 2)
    return dq.transpose(1, 2), per_kv_head(dk), per_kv_head(dv)


def attention_varlen_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                              cu_seqlens_k: Tensor, dlse: Tensor | None = None, **kwargs):
    """attention_backward() per sequence of a packed ragged batch (dlse (H, total_q))."""
    dq, dk, dv = torch.zeros_like(q, dtype=kwargs.get("compute_dtype", torch.float64)), None, None
    dk = torch.zeros_like(k, dtype=dq.dtype)
    dv = torch.zeros_like(v, dtype=dq.dtype)
    for b in range(len(cu_seqlens_q) - 1):
        qs = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]))
        ks = slice(int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1]))
        g = attention_backward(dout[None, qs], q[None, qs], k[None, ks], v[None, ks],
                               dlse=None if dlse is None else dlse[None, :, qs], **kwargs)
        dq[qs], dk[ks], dv[ks] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv


def block_sparse_mask(block_mask: Tensor, block_size: tuple[int, int], seqlen_q: int, seqlen_k: int) -> Tensor:
    """The (B or 1, H or 1, Sq, Sk) boolean mask of a block mask (B or 1, H or 1, ⌈Sq/R⌉, ⌈Sk/C⌉):
    query i may see key j when block_mask[..., i // R, j // C] (FlashInfer's block-sparse layout)."""
    rows, cols = block_size
    dense = block_mask.bool().repeat_interleave(rows, dim=-2).repeat_interleave(cols, dim=-1)
    return dense[..., :seqlen_q, :seqlen_k]


def block_sparse_attention(q: Tensor, k: Tensor, v: Tensor, block_mask: Tensor, block_size: tuple[int, int],
                           **kwargs):
    """attention() where query block i (R rows) sees key block j (C columns) only if
    block_mask[b, h, i, j] (dims of size 1 broadcast over batch and heads), and the other masks
    (causal, windows) as well. A query that sees no key outputs 0 with lse −inf."""
    return attention(q, k, v, mask=block_sparse_mask(block_mask, block_size, q.shape[1], k.shape[1]), **kwargs)


def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, **kwargs):
    """Packed ragged batch: q (total_q, H, D), k/v (total_k, Hkv, D); sequence b is
    rows cu_seqlens[b]:cu_seqlens[b + 1]. Each sequence is attention() on its own.
    Returns out (total_q, H, D) and with return_lse also lse (H, total_q)."""
    return_lse = kwargs.get("return_lse", False)
    outs, lses = [], []
    for b in range(len(cu_seqlens_q) - 1):
        qs = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]))
        ks = slice(int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1]))
        result = attention(q[None, qs], k[None, ks], v[None, ks], **kwargs)
        out, lse = result if return_lse else (result, None)
        outs.append(out[0])
        if return_lse:
            lses.append(lse[0])
    out = torch.cat(outs, dim=0)
    return (out, torch.cat(lses, dim=-1)) if return_lse else out


def kvcache_positions(cache_seqlens: Tensor, block_table: Tensor | None, page_size: int, length: int,
                      batch: int) -> tuple[Tensor, Tensor]:
    """Where token t < length of sequence `batch` lives in a KV cache: (page or batch index, slot).
    Dense cache (block_table None): (batch, t). Paged: (block_table[batch, t // page_size], t % page_size)."""
    t = torch.arange(length, device=cache_seqlens.device)
    if block_table is None:
        return torch.full_like(t, batch), t
    return block_table[batch, t // page_size].long(), t % page_size


def attention_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
                           k: Tensor | None = None, v: Tensor | None = None, block_table: Tensor | None = None,
                           return_lse: bool = False, **kwargs):
    """Attention of q (B, Sq, H, D) over each sequence's KV cache, the definition of
    flash_attention_with_kvcache: sequence b holds cache_seqlens[b] tokens, in k_cache/v_cache
    (B, S_max, Hkv, D) rows [0, len) or, paged, in (num_pages, page_size, Hkv, D) pages
    block_table[b, 0], block_table[b, 1], … (token t at page block_table[b, t // page_size], slot
    t % page_size). New tokens k, v (B, S_new, Hkv, D), when given, are written into the cache at
    tokens [len, len + S_new) — in place, into the tensors passed — and attended to as well. The
    queries are the last Sq positions (bottom-right alignment: causal query i sees key
    j ≤ i + total − Sq). kwargs: attention()'s (causal, softmax_scale, window_size, softcap,
    compute_dtype). Returns out (B, Sq, H, D) and with return_lse the lse (B, H, Sq)."""
    batch = q.shape[0]
    page_size = k_cache.shape[1]
    new = 0 if k is None else k.shape[1]
    outs, lses = [], []
    for b in range(batch):
        length = int(cache_seqlens[b])
        if new:
            where, slot = kvcache_positions(cache_seqlens, block_table, page_size, length + new, b)
            k_cache[where[length:], slot[length:]] = k[b]
            v_cache[where[length:], slot[length:]] = v[b]
        where, slot = kvcache_positions(cache_seqlens, block_table, page_size, length + new, b)
        keys, values = k_cache[where, slot][None], v_cache[where, slot][None]  # (1, total, Hkv, D)
        result = attention(q[b:b + 1], keys, values, return_lse=True, **kwargs)
        outs.append(result[0])
        lses.append(result[1])
    out, lse = torch.cat(outs), torch.cat(lses)
    return (out, lse) if return_lse else out


def merge_attention_states(o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """The attention over two disjoint key sets from each one's normalised output and natural-log
    lse (o (B, S, H, D) with lse (B, H, S), or (total, H, D) with (H, total)), in float64:
    lse = logaddexp(lse_a, lse_b), o = exp(lse_a − lse)·o_a + exp(lse_b − lse)·o_b; both −inf: 0, −inf."""
    la, lb = lse_a.double(), lse_b.double()
    lse = torch.logaddexp(la, lb)
    empty = torch.isneginf(la) & torch.isneginf(lb)
    safe = torch.where(empty, torch.zeros_like(lse), lse)
    wa = torch.where(torch.isneginf(la), torch.zeros_like(la), torch.exp(la - safe))
    wb = torch.where(torch.isneginf(lb), torch.zeros_like(lb), torch.exp(lb - safe))
    # lse (..., H, S) → weights (..., S, H, 1) beside o
    wa, wb = wa.transpose(-1, -2)[..., None], wb.transpose(-1, -2)[..., None]
    zero = torch.zeros((), dtype=torch.float64, device=o_a.device)
    # a side of weight 0 contributes nothing, whatever its o holds (an empty side's may be NaN)
    o = torch.where(wa == 0, zero, wa * o_a.double()) + torch.where(wb == 0, zero, wb * o_b.double())
    return o, lse.float()


# ---- online softmax: the building block of FlashAttention -------------------------------------


def online_softmax(x: Tensor, tile: int) -> Tensor:
    """softmax over the last dim, reading each row one tile of `tile` columns at a time and
    never holding the whole row's exponentials (Milakov & Gimelshein, 2018).

    Per tile t, with running row_max m and row_sum l (sums of exp(x − m)):
        m_new = max(m, max(t))
        l     = l · exp(m − m_new) + Σ exp(t − m_new)     # rescale what was summed under the old max
    and at the end softmax(x) = exp(x − m) / l. Two tiles, never the whole row: for x = [a | b],
    l = Σ exp(a − m_a) · exp(m_a − m) + Σ exp(b − m), which is Σ exp(x − m) exactly.
    """
    x = _f64(x)
    row_max = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    row_sum = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[-1], tile):
        t = x[..., start:start + tile]
        new_max = torch.maximum(row_max, t.amax(dim=-1))
        safe_max = _safe_max(new_max)  # a row that has seen only −inf keeps row_sum 0
        row_sum = row_sum * torch.exp(row_max - safe_max) + torch.exp(t - safe_max[..., None]).sum(dim=-1)
        row_max = new_max
    return torch.exp(x - _safe_max(row_max)[..., None]) / row_sum[..., None]


def attention_tiled(q: Tensor, k: Tensor, v: Tensor, block_n: int = 64, causal: bool = False,
                    softmax_scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                    softcap: float = 0.0) -> tuple[Tensor, Tensor]:
    """The FlashAttention-2 forward loop in plain PyTorch (float64): each query row walks the
    key/value tiles, keeping row_max, row_sum and the unnormalised output acc_o, rescaled by
    exp(row_max_old − row_max_new) whenever a tile raises the max. Never forms the (Sq, Sk)
    probability matrix; equals attention() (tested). Returns (out, lse) like attention()."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k = k.shape[1]
    qf, kf, vf, scale = _heads_first(q, k, v, softmax_scale, torch.float64)
    visible = attention_mask(seqlen_q, seqlen_k, causal, window_size, device=q.device)
    row_max = torch.full((batch, heads, seqlen_q), float("-inf"), dtype=torch.float64, device=q.device)
    row_sum = torch.zeros_like(row_max)
    acc_o = torch.zeros(batch, heads, seqlen_q, head_dim, dtype=torch.float64, device=q.device)
    for n_start in range(0, seqlen_k, block_n):
        cols = slice(n_start, n_start + block_n)
        s = qf @ kf[:, :, cols].transpose(-1, -2) * scale  # S = Q Kᵀ · scale, one tile
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~visible[:, cols], float("-inf"))
        new_max = torch.maximum(row_max, s.amax(dim=-1))
        safe_max = _safe_max(new_max)
        p = torch.exp(s - safe_max[..., None])  # P = exp(S − m_new), stays "in registers"
        alpha = torch.exp(row_max - safe_max)  # rescale of everything accumulated so far
        row_sum = row_sum * alpha + p.sum(dim=-1)
        acc_o = acc_o * alpha[..., None] + p @ vf[:, :, cols]  # O += P V
        row_max = new_max
    empty = row_sum == 0
    out = torch.where(empty[..., None], torch.zeros_like(acc_o), acc_o / torch.where(empty, 1.0, row_sum)[..., None])
    lse = torch.where(empty, float("-inf"), row_max + torch.log(torch.where(empty, 1.0, row_sum)))
    return out.transpose(1, 2), lse.float()
