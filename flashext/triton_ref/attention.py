"""Triton twin of the FlashAttention-2 forward in csrc/kernels/attention/flash_fwd_kernel.cuh
(same names, same loop; the CUDA kernel adds the tiling of fragments across warps).

flash_attention_fwd_kernel: program (m_block, batch · H + head) owns BLOCK_M query rows of one
head and walks the key/value tiles of its KV head (head // GROUP) BLOCK_N at a time:

    S      = Q Kᵀ                                  (fp32 accumulate)
    S      = softcap · tanh(S · scale / softcap)   when softcap > 0, then · log2 e
           = S · scale_log2                        otherwise (scale_log2 = scale · log2 e)
    S      = −inf where the key is masked (past seqlen_k, causal/window, bottom-right aligned)
    m_new  = max(row_max, rowmax(S))
    P      = exp2(S − m_new)                       kept in registers, cast to V's dtype
    alpha  = exp2(row_max − m_new)
    row_sum = row_sum · alpha + rowsum(P)
    acc_o   = acc_o · alpha + P V
and finally O = acc_o / row_sum, lse = (row_max + log2 row_sum) · ln 2 (natural log). A row that
sees no key (row_sum = 0) writes O = 0 and lse = −inf. Only the key tiles that can be visible to
the block's rows are visited (causal and window bounds).

Varlen: with cu_seqlens, batch b's rows are cu_seqlens[b]:cu_seqlens[b + 1] of the packed tensors.

The backward (csrc/kernels/attention/flash_bwd_kernel.cuh): D = rowsum(dO ∘ O) − dlse and
lse · log2 e (+inf for a row that saw no key) first, then flash_attention_bwd_kernel: program
(n_block, batch · Hkv + kv_head) owns BLOCK_N keys of one KV head, keeps their dK and dV while the
visible query blocks of every query head of the group walk past, and adds each block's dQ into an
fp32 buffer:

    S   = Q Kᵀ (soft-capped as in the forward),  P = exp2(S · scale_log2 − lse · log2 e)
    dV += Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − D)  (∘ (1 − tanh²) soft-capped)
    dK += dSᵀ Q,  dQ += dS K   (atomics);   finally dK · scale, dQ · scale
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from .common import tanh_parts, to_dtype

kLog2e = tl.constexpr(1.4426950408889634)
kLn2 = tl.constexpr(0.6931471805599453)


@triton.jit
def flash_attention_fwd_kernel(
    Q, K, V, O, LSE, CU_SEQLENS_Q, CU_SEQLENS_K,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    seqlen_q_fixed, seqlen_k_fixed, head_dim, scale, scale_log2, softcap, window_left, window_right,
    H: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, VARLEN: tl.constexpr, HAS_SOFTCAP: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    BLOCK_MASK=None, stride_mb=0, stride_mh=0, stride_mr=0, stride_mc=0, mask_rows=1, mask_cols=1,
    BLOCK_SPARSE: tl.constexpr = False,
):
    m_block = tl.program_id(0)
    batch = tl.program_id(1) // H
    head = tl.program_id(1) % H
    kv_head = head // GROUP

    if VARLEN:
        q_start = tl.load(CU_SEQLENS_Q + batch).to(tl.int64)
        k_start = tl.load(CU_SEQLENS_K + batch).to(tl.int64)
        seqlen_q = (tl.load(CU_SEQLENS_Q + batch + 1) - q_start).to(tl.int32)
        seqlen_k = (tl.load(CU_SEQLENS_K + batch + 1) - k_start).to(tl.int32)
        batch_offset_q = q_start * stride_qs
        batch_offset_k = k_start * stride_ks
        batch_offset_v = k_start * stride_vs
        batch_offset_o = q_start * stride_os
        lse_offset = q_start  # lse is (H, total_q)
    else:
        seqlen_q = seqlen_q_fixed
        seqlen_k = seqlen_k_fixed
        batch_offset_q = batch.to(tl.int64) * stride_qb
        batch_offset_k = batch.to(tl.int64) * stride_kb
        batch_offset_v = batch.to(tl.int64) * stride_vb
        batch_offset_o = batch.to(tl.int64) * stride_ob
        lse_offset = batch.to(tl.int64) * stride_lb

    m_start = m_block * BLOCK_M
    if m_start < seqlen_q:
        offs_m = m_start + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        row_valid = offs_m < seqlen_q
        d_valid = offs_d < head_dim
        q = tl.load(Q + batch_offset_q + head * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                    mask=row_valid[:, None] & d_valid[None, :], other=0.0)

        # Key columns visible to this block's rows: diagonal offset of bottom-right alignment.
        diag = seqlen_k - seqlen_q
        n_lo = 0
        n_hi = seqlen_k
        if window_left >= 0:
            n_lo = tl.maximum(m_start + diag - window_left, 0)
            n_lo = (n_lo // BLOCK_N) * BLOCK_N
        if window_right >= 0:
            n_hi = tl.minimum(m_start + BLOCK_M - 1 + diag + window_right + 1, seqlen_k)

        row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc_o = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for n_start in range(n_lo, n_hi, BLOCK_N):
            offs_n = n_start + tl.arange(0, BLOCK_N)
            col_valid = offs_n < seqlen_k
            kv_mask = col_valid[:, None] & d_valid[None, :]
            k = tl.load(K + batch_offset_k + kv_head * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :],
                        mask=kv_mask, other=0.0)
            v = tl.load(V + batch_offset_v + kv_head * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :],
                        mask=kv_mask, other=0.0)
            if DOT_IN_FP32:  # interpreter + bf16 only: its tl.dot multiplies bf16's raw bits
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
            else:
                s = tl.dot(q, tl.trans(k))  # S = Q Kᵀ
            if HAS_SOFTCAP:
                one_plus_t, _ = tanh_parts(s * (scale / softcap))
                s = softcap * (one_plus_t - 1.0) * kLog2e
            else:
                s = s * scale_log2
            # key j visible to row i: j < seqlen_k, i + diag − left ≤ j ≤ i + diag + right (−1: unbounded)
            visible = col_valid[None, :] & (
                (window_left < 0) | (offs_n[None, :] >= offs_m[:, None] + diag - window_left))
            visible = visible & ((window_right < 0) | (offs_n[None, :] <= offs_m[:, None] + diag + window_right))
            if BLOCK_SPARSE:  # query block i // R sees key block j // C only where the block mask says so
                active = tl.load(BLOCK_MASK + batch * stride_mb + head * stride_mh + (offs_m // mask_rows)[:, None] * stride_mr
                                 + (offs_n // mask_cols)[None, :] * stride_mc,
                                 mask=row_valid[:, None] & col_valid[None, :], other=0)
                visible = visible & (active != 0)
            s = tl.where(visible, s, float("-inf"))

            new_max = tl.maximum(row_max, tl.max(s, axis=1))
            # A row that has seen only masked keys keeps max −inf: exp2(−inf − −inf) would be NaN.
            safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
            p = tl.exp2(s - safe_max[:, None])  # P = exp2(S − m_new)
            alpha = tl.exp2(row_max - safe_max)  # rescale what was accumulated under the old max
            row_sum = row_sum * alpha + tl.sum(p, axis=1)
            p_v = to_dtype(p, v.dtype)  # P in V's dtype, as the tensor cores take it
            if DOT_IN_FP32:
                acc_o = acc_o * alpha[:, None] + tl.dot(p_v.to(tl.float32), v.to(tl.float32))
            else:
                acc_o = acc_o * alpha[:, None] + tl.dot(p_v, v)  # O += P V
            row_max = new_max

        empty = row_sum == 0.0
        out = acc_o / tl.where(empty, 1.0, row_sum)[:, None]
        tl.store(O + batch_offset_o + head * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
                 to_dtype(out, O.dtype.element_ty), mask=row_valid[:, None] & d_valid[None, :])
        lse = tl.where(empty, float("-inf"), (row_max + tl.log2(tl.where(empty, 1.0, row_sum))) * kLn2)
        tl.store(LSE + lse_offset + head * stride_lh + offs_m, lse, mask=row_valid)


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _check_qkv(q: Tensor, k: Tensor, v: Tensor, heads: int, heads_kv: int) -> None:
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError("flash_attention twin: the last dim of q, k and v must be contiguous")
    if heads % heads_kv != 0:
        raise ValueError(f"flash_attention twin: H = {heads} is not a multiple of Hkv = {heads_kv}")


def _dot_in_fp32(q: Tensor) -> bool:
    # bf16 values are exact in fp32 and their products too: same math, accumulation order aside
    return os.environ.get("TRITON_INTERPRET") == "1" and q.dtype == torch.bfloat16


def _scale(head_dim: int, softmax_scale: float | None) -> float:
    return head_dim**-0.5 if softmax_scale is None else softmax_scale


def _window(window_size: tuple[int, int], causal: bool) -> tuple[int, int]:
    """(left, right) as the kernels take them: causal is right = 0."""
    return window_size[0], 0 if causal else window_size[1]


def flash_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, softmax_scale: float | None = None,
                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    block_m: int = 64, block_n: int = 64, out: Tensor | None = None,
                    lse: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """q (B, Sq, H, D), k/v (B, Sk, Hkv, D), last dim contiguous → (out (B, Sq, H, D), lse (B, H, Sq) fp32).
    out/lse: buffers to write into (tests pass NaN-filled ones)."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty(batch, heads, seqlen_q, dtype=torch.float32, device=q.device) if lse is None else lse
    _launch(q, k, v, out, lse, None, None, batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim,
            (q.stride(0), q.stride(1), q.stride(2)), (k.stride(0), k.stride(1), k.stride(2)),
            (v.stride(0), v.stride(1), v.stride(2)), (out.stride(0), out.stride(1), out.stride(2)),
            (lse.stride(0), lse.stride(1)), causal, softmax_scale, window_size, softcap, block_m, block_n)
    return out, lse


def flash_attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                           softmax_scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                           softcap: float = 0.0, block_m: int = 64, block_n: int = 64) -> tuple[Tensor, Tensor]:
    """Packed q (total_q, H, D), k/v (total_k, Hkv, D), int32 cu_seqlens (B + 1)
    → (out (total_q, H, D), lse (H, total_q) fp32)."""
    total_q, heads, head_dim = q.shape
    heads_kv = k.shape[1]
    out = torch.empty_like(q)
    lse = torch.empty(heads, total_q, dtype=torch.float32, device=q.device)
    batch = cu_seqlens_q.numel() - 1
    _launch(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, batch, max_seqlen_q, max_seqlen_k, heads, heads_kv,
            head_dim, (0, q.stride(0), q.stride(1)), (0, k.stride(0), k.stride(1)), (0, v.stride(0), v.stride(1)),
            (0, out.stride(0), out.stride(1)), (0, lse.stride(0)), causal, softmax_scale, window_size, softcap,
            block_m, block_n)
    return out, lse


def block_sparse_attention(q: Tensor, k: Tensor, v: Tensor, block_mask: Tensor, block_size: tuple[int, int],
                           causal: bool = False, softmax_scale: float | None = None,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, block_m: int = 64,
                           block_n: int = 64) -> tuple[Tensor, Tensor]:
    """flash_attention where query block i (R rows) sees key block j (C keys) only if
    block_mask[b, h, i, j] (B or 1, H or 1, ⌈Sq/R⌉, ⌈Sk/C⌉): the forward loop with the mask looked up
    per element (flashext.reference.block_sparse_attention)."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    mask = block_mask.to(torch.int8)
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, seqlen_q, dtype=torch.float32, device=q.device)
    stride = lambda dim: 0 if mask.shape[dim] == 1 else mask.stride(dim)  # noqa: E731  (broadcast dims)
    _launch(q, k, v, out, lse, None, None, batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim,
            (q.stride(0), q.stride(1), q.stride(2)), (k.stride(0), k.stride(1), k.stride(2)),
            (v.stride(0), v.stride(1), v.stride(2)), (out.stride(0), out.stride(1), out.stride(2)),
            (lse.stride(0), lse.stride(1)), causal, softmax_scale, window_size, softcap, block_m, block_n,
            extra={"BLOCK_MASK": mask, "stride_mb": stride(0), "stride_mh": stride(1), "stride_mr": mask.stride(2),
                   "stride_mc": mask.stride(3), "mask_rows": block_size[0], "mask_cols": block_size[1],
                   "BLOCK_SPARSE": True})
    return out, lse


def _launch(q, k, v, out, lse, cu_q, cu_k, batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim,
            sq, sk, sv, so, sl, causal, softmax_scale, window_size, softcap, block_m, block_n, extra=None):
    _check_qkv(q, k, v, heads, heads_kv)
    if batch == 0 or seqlen_q == 0 or heads == 0:
        return
    scale = _scale(head_dim, softmax_scale)
    left, right = _window(window_size, causal)
    varlen = cu_q is not None
    grid = (triton.cdiv(seqlen_q, block_m), batch * heads)
    flash_attention_fwd_kernel[grid](
        q, k, v, out, lse, cu_q if varlen else q, cu_k if varlen else q,
        *sq, *sk, *sv, *so, *sl,
        seqlen_q, seqlen_k, head_dim, scale, scale * math.log2(math.e), softcap, left, right,
        H=heads, GROUP=heads // heads_kv, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=_block_d(head_dim),
        VARLEN=varlen, HAS_SOFTCAP=softcap > 0, DOT_IN_FP32=_dot_in_fp32(q),
        **(extra or {}),  # block-sparse: the mask and its layout
    )


@triton.jit
def flash_attention_bwd_kernel(
    Q, K, V, DO, DK, DV, DQ_ACCUM, LSE2, DSUM, CU_SEQLENS_Q, CU_SEQLENS_K,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
    stride_lb, stride_lh, seqlen_q_fixed, seqlen_k_fixed, head_dim, scale, scale_log2, softcap,
    window_left, window_right,
    H: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, VARLEN: tl.constexpr, HAS_SOFTCAP: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    n_block = tl.program_id(0)
    heads_kv = H // GROUP
    batch = tl.program_id(1) // heads_kv
    kv_head = tl.program_id(1) % heads_kv

    if VARLEN:
        q_start = tl.load(CU_SEQLENS_Q + batch).to(tl.int64)
        k_start = tl.load(CU_SEQLENS_K + batch).to(tl.int64)
        seqlen_q = (tl.load(CU_SEQLENS_Q + batch + 1) - q_start).to(tl.int32)
        seqlen_k = (tl.load(CU_SEQLENS_K + batch + 1) - k_start).to(tl.int32)
        offset_q, offset_do = q_start * stride_qs, q_start * stride_dos
        offset_k, offset_v = k_start * stride_ks, k_start * stride_vs
        offset_dk, offset_dv = k_start * stride_dks, k_start * stride_dvs
        offset_stats = q_start  # (H, total_q)
        accum_row0 = q_start  # dq_accum (total_q, H, D)
    else:
        seqlen_q = seqlen_q_fixed
        seqlen_k = seqlen_k_fixed
        b = batch.to(tl.int64)
        offset_q, offset_do = b * stride_qb, b * stride_dob
        offset_k, offset_v = b * stride_kb, b * stride_vb
        offset_dk, offset_dv = b * stride_dkb, b * stride_dvb
        offset_stats = b * stride_lb
        accum_row0 = b * seqlen_q_fixed  # dq_accum (B · Sq, H, D)

    n_start = n_block * BLOCK_N
    if n_start < seqlen_k:
        offs_n = n_start + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        col_valid = offs_n < seqlen_k
        d_valid = offs_d < head_dim
        kv_mask = col_valid[:, None] & d_valid[None, :]
        k = tl.load(K + offset_k + kv_head * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        v = tl.load(V + offset_v + kv_head * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        if DOT_IN_FP32:  # interpreter + bf16 only: its tl.dot multiplies bf16's raw bits
            k_dot = k.to(tl.float32)
            v_dot = v.to(tl.float32)
        else:
            k_dot = k
            v_dot = v
        acc_dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        acc_dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

        # Query rows that can see a key of this block (bottom-right diagonal offset).
        diag = seqlen_k - seqlen_q
        m_lo = 0
        m_hi = seqlen_q
        if window_right >= 0:
            m_lo = (tl.maximum(n_start - diag - window_right, 0) // BLOCK_M) * BLOCK_M
        if window_left >= 0:
            m_hi = tl.minimum(n_start + BLOCK_N - 1 - diag + window_left + 1, seqlen_q)
        for g in range(GROUP):
            head = kv_head * GROUP + g
            for m_start in range(m_lo, m_hi, BLOCK_M):
                offs_m = m_start + tl.arange(0, BLOCK_M)
                row_valid = offs_m < seqlen_q
                q_mask = row_valid[:, None] & d_valid[None, :]
                q = tl.load(Q + offset_q + head * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                            mask=q_mask, other=0.0)
                do = tl.load(DO + offset_do + head * stride_doh + offs_m[:, None] * stride_dos + offs_d[None, :],
                             mask=q_mask, other=0.0)
                lse2 = tl.load(LSE2 + offset_stats + head * stride_lh + offs_m, mask=row_valid, other=0.0)
                dsum = tl.load(DSUM + offset_stats + head * stride_lh + offs_m, mask=row_valid, other=0.0)
                if DOT_IN_FP32:
                    q_dot = q.to(tl.float32)
                    do_dot = do.to(tl.float32)
                else:
                    q_dot = q
                    do_dot = do
                s = tl.dot(q_dot, tl.trans(k_dot))  # S = Q Kᵀ
                if HAS_SOFTCAP:
                    one_plus_t, one_minus_t2 = tanh_parts(s * (scale / softcap))
                    s = softcap * (one_plus_t - 1.0) * kLog2e
                else:
                    s = s * scale_log2
                visible = row_valid[:, None] & col_valid[None, :] & (
                    (window_left < 0) | (offs_n[None, :] >= offs_m[:, None] + diag - window_left))
                visible = visible & ((window_right < 0) | (offs_n[None, :] <= offs_m[:, None] + diag + window_right))
                p = tl.where(visible, tl.exp2(s - lse2[:, None]), 0.0)  # P, recomputed from the lse
                p16 = to_dtype(p, V.dtype.element_ty)
                dp = tl.dot(do_dot, tl.trans(v_dot))  # dP = dO Vᵀ
                ds = p * (dp - dsum[:, None])  # dS = P ∘ (dP − D)
                if HAS_SOFTCAP:
                    ds = ds * one_minus_t2
                ds16 = to_dtype(ds, Q.dtype.element_ty)
                if DOT_IN_FP32:
                    p16 = p16.to(tl.float32)
                    ds16 = ds16.to(tl.float32)
                acc_dv += tl.dot(tl.trans(p16), do_dot)  # dV += Pᵀ dO
                acc_dk += tl.dot(tl.trans(ds16), q_dot)  # dK += dSᵀ Q
                dq = tl.dot(ds16, k_dot)  # this block's share of dQ = dS K
                accum = DQ_ACCUM + ((accum_row0 + offs_m[:, None]) * H + head) * head_dim + offs_d[None, :]
                tl.atomic_add(accum, dq, mask=q_mask)

        dk_ptrs = DK + offset_dk + kv_head * stride_dkh + offs_n[:, None] * stride_dks + offs_d[None, :]
        dv_ptrs = DV + offset_dv + kv_head * stride_dvh + offs_n[:, None] * stride_dvs + offs_d[None, :]
        tl.store(dk_ptrs, to_dtype(acc_dk * scale, DK.dtype.element_ty), mask=kv_mask)
        tl.store(dv_ptrs, to_dtype(acc_dv, DV.dtype.element_ty), mask=kv_mask)


def _bwd_stats(dout: Tensor, out: Tensor, lse: Tensor, dlse: Tensor | None) -> tuple[Tensor, Tensor]:
    """D = rowsum(dO ∘ O) − dlse, laid out like lse, and lse · log2 e (+inf where lse = −inf)."""
    dsum = (dout.float() * out.float()).sum(-1)  # (..., S, H)
    dsum = dsum.transpose(-1, -2).contiguous()  # like lse: (B, H, Sq) or (H, total_q)
    if dlse is not None:
        dsum = dsum - dlse
    lse2 = torch.where(torch.isneginf(lse), float("inf"), lse * math.log2(math.e)).contiguous()
    return dsum, lse2


def flash_attention_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                             causal: bool = False, softmax_scale: float | None = None,
                             window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             dlse: Tensor | None = None, block_m: int = 64,
                             block_n: int = 64) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of flash_attention for dout (B, Sq, H, D), from its out and lse (B, H, Sq)."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k = k.shape[1]
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    dsum, lse2 = _bwd_stats(dout, out, lse, dlse)
    dq_accum = torch.zeros(batch * seqlen_q, heads, head_dim, dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    _launch_bwd(dout, q, k, v, dk, dv, dq_accum, lse2, dsum, None, None, batch, seqlen_q, seqlen_k,
                (q.stride(0), q.stride(1), q.stride(2)), (k.stride(0), k.stride(1), k.stride(2)),
                (v.stride(0), v.stride(1), v.stride(2)), (dout.stride(0), dout.stride(1), dout.stride(2)),
                (dk.stride(0), dk.stride(1), dk.stride(2)), (dv.stride(0), dv.stride(1), dv.stride(2)),
                (lse2.stride(0), lse2.stride(1)), causal, softmax_scale, window_size, softcap, block_m, block_n)
    return dq_accum.view(q.shape).mul(_scale(head_dim, softmax_scale)).to(q.dtype), dk, dv


def flash_attention_varlen_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                    cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                                    max_seqlen_k: int, causal: bool = False, softmax_scale: float | None = None,
                                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                                    dlse: Tensor | None = None, block_m: int = 64,
                                    block_n: int = 64) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of flash_attention_varlen, from its out and lse (H, total_q)."""
    total_q, heads, head_dim = q.shape
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    dsum, lse2 = _bwd_stats(dout, out, lse, dlse)
    dq_accum = torch.zeros(total_q, heads, head_dim, dtype=torch.float32, device=q.device)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)  # rows no sequence covers stay 0
    _launch_bwd(dout, q, k, v, dk, dv, dq_accum, lse2, dsum, cu_seqlens_q, cu_seqlens_k,
                cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k, (0, q.stride(0), q.stride(1)),
                (0, k.stride(0), k.stride(1)), (0, v.stride(0), v.stride(1)), (0, dout.stride(0), dout.stride(1)),
                (0, dk.stride(0), dk.stride(1)), (0, dv.stride(0), dv.stride(1)), (0, lse2.stride(0)), causal,
                softmax_scale, window_size, softcap, block_m, block_n)
    return dq_accum.mul(_scale(head_dim, softmax_scale)).to(q.dtype), dk, dv




def _launch_bwd(dout, q, k, v, dk, dv, dq_accum, lse2, dsum, cu_q, cu_k, batch, seqlen_q, seqlen_k,
                sq, sk, sv, sdo, sdk, sdv, sl, causal, softmax_scale, window_size, softcap, block_m, block_n):
    heads, head_dim, heads_kv = q.shape[-2], q.shape[-1], k.shape[-2]
    _check_qkv(q, k, v, heads, heads_kv)
    if batch == 0 or seqlen_k == 0:
        dk.zero_()
        dv.zero_()
        return
    scale = _scale(head_dim, softmax_scale)
    left, right = _window(window_size, causal)
    varlen = cu_q is not None
    block_d = _block_d(head_dim)
    stages = {}
    if block_d > 128:  # K, V, Q and dO tiles of 256 columns: halved and not pipelined, to fit 227 KB
        block_m, block_n, stages = min(block_m, 32), min(block_n, 32), {"num_stages": 1}
    grid = (triton.cdiv(seqlen_k, block_n), batch * heads_kv)
    flash_attention_bwd_kernel[grid](
        q, k, v, dout, dk, dv, dq_accum, lse2, dsum, cu_q if varlen else q, cu_k if varlen else q,
        *sq, *sk, *sv, *sdo, *sdk, *sdv, *sl,
        seqlen_q, seqlen_k, head_dim, scale, scale * math.log2(math.e), softcap, left, right,
        H=heads, GROUP=heads // heads_kv, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        VARLEN=varlen, HAS_SOFTCAP=softcap > 0, DOT_IN_FP32=_dot_in_fp32(q), **stages,
    )


@triton.jit
def merge_attention_states_kernel(
    O_A, LSE_A, O_B, LSE_B, O, LSE, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ls,
    seqlen, head_dim, H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program (batch · S + s, head): the weights of the two sides from their lse, then one row."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    b = row // seqlen
    s = row % seqlen
    lse_off = b.to(tl.int64) * stride_lb + head * stride_lh + s * stride_ls
    lse_a = tl.load(LSE_A + lse_off)
    lse_b = tl.load(LSE_B + lse_off)
    m = tl.where(lse_a > lse_b, lse_a, lse_b)  # NaN in either side stays NaN below
    empty = m == float("-inf")
    safe_m = tl.where(empty, 0.0, m)
    e_a = tl.exp(lse_a - safe_m)
    e_b = tl.exp(lse_b - safe_m)
    total = e_a + e_b
    w_a = tl.where(empty, 0.0, e_a / tl.where(empty, 1.0, total))
    w_b = tl.where(empty, 0.0, e_b / tl.where(empty, 1.0, total))
    tl.store(LSE + lse_off, tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, total))))
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < head_dim
    o_off = b.to(tl.int64) * stride_ob + s * stride_os + head * stride_oh + offs_d
    a = tl.load(O_A + o_off, mask=d_valid, other=0.0).to(tl.float32)
    o_b = tl.load(O_B + o_off, mask=d_valid, other=0.0).to(tl.float32)
    out = tl.where(w_a == 0.0, 0.0, w_a * a) + tl.where(w_b == 0.0, 0.0, w_b * o_b)
    tl.store(O + o_off, to_dtype(out, O.dtype.element_ty), mask=d_valid)


def merge_attention_states(o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """(o, lse) of two partial results: o (B, S, H, D) or (total, H, D), lse (B, H, S) or (H, total)."""
    packed = o_a.dim() == 3
    o4 = lambda t: t[None] if packed else t  # noqa: E731
    l3 = lambda t: t[None] if packed else t  # noqa: E731
    a, b_, la, lb = (o4(o_a.contiguous()), o4(o_b.contiguous()), l3(lse_a.contiguous()), l3(lse_b.contiguous()))
    out, lse = torch.empty_like(a), torch.empty_like(la)
    batch, seqlen, heads, head_dim = a.shape
    if out.numel():
        merge_attention_states_kernel[(batch * seqlen, heads)](
            a, la, b_, lb, out, lse, out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
            lse.stride(2), seqlen, head_dim, H=heads, BLOCK_D=_block_d(head_dim))
    return (out[0], lse[0]) if packed else (out, lse)


# ---- decode and KV caches ---------------------------------------------------------------------------


@triton.jit
def cache_slots(b, tokens, valid, BLOCK_TABLE, stride_bt, page_size, num_pages, PAGED: tl.constexpr):
    """Where `tokens` (a block or a scalar) of sequence b live in a KV cache, as flash_decode.cu's
    cache_row: (b, t) in a dense cache, or (page block_table[b, t // page_size] clamped into
    [0, num_pages), slot t % page_size); a row's offset is first · page stride + second · row stride."""
    if PAGED:
        page = tl.load(BLOCK_TABLE + b * stride_bt + tokens // page_size, mask=valid, other=0)
        return tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64), tokens % page_size
    else:
        return b.to(tl.int64), tokens


@triton.jit
def attention_kvcache_split_kernel(
    Q, K_CACHE, V_CACHE, CACHE_SEQLENS, BLOCK_TABLE, O_PART, LSE_PART,
    stride_qb, stride_qs, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    stride_bt, seqlen_q, seqlen_new, head_dim, page_size, num_pages, capacity, split_keys, scale, scale_log2,
    softcap, window_left, window_right, batch,
    H: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGED: tl.constexpr, HAS_SOFTCAP: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    """Program (row block, batch · Hkv + kv_head, split): rows are (query position, query head of the
    group) pairs, the group's heads packed together so a KV byte is read once per KV head. Keys are
    the split's range [split · split_keys, (split + 1) · split_keys) of the sequence's
    cache_seqlens[b] + seqlen_new tokens, gathered through the page table when PAGED. Writes the
    split's normalised partial output and lse (merged across splits afterwards). Lengths past the
    capacity are clamped to it (a negative one counts as 0) and page ids into [0, num_pages), as
    the CUDA kernel clamps them."""
    row_block = tl.program_id(0)
    b = tl.program_id(1) // (H // GROUP)
    kv_head = tl.program_id(1) % (H // GROUP)
    split = tl.program_id(2)
    cached = tl.maximum(tl.load(CACHE_SEQLENS + b), 0)
    total_k = tl.where(cached >= capacity - seqlen_new, capacity, cached + seqlen_new)  # (no int32 overflow)
    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    query = rows // GROUP  # query position
    head = kv_head * GROUP + rows % GROUP
    row_valid = query < seqlen_q
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < head_dim
    q = tl.load(Q + b.to(tl.int64) * stride_qb + query[:, None] * stride_qs + head[:, None] * stride_qh
                + offs_d[None, :], mask=row_valid[:, None] & d_valid[None, :], other=0.0)
    if DOT_IN_FP32:
        q = q.to(tl.float32)
    diag = total_k - seqlen_q  # bottom-right: the last query sits at the last key
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc_o = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    n_lo = split * split_keys
    n_hi = tl.minimum(n_lo + split_keys, total_k)
    for n_start in range(n_lo, n_hi, BLOCK_N):
        offs_n = n_start + tl.arange(0, BLOCK_N)
        col_valid = offs_n < n_hi
        unit, slot = cache_slots(b, offs_n, col_valid, BLOCK_TABLE, stride_bt, page_size, num_pages, PAGED)
        k_rows = unit * stride_kp + slot * stride_ks
        v_rows = unit * stride_vp + slot * stride_vs
        kv_mask = col_valid[:, None] & d_valid[None, :]
        k = tl.load(K_CACHE + k_rows[:, None] + kv_head * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V_CACHE + v_rows[:, None] + kv_head * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)
        if DOT_IN_FP32:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k))
        if HAS_SOFTCAP:
            one_plus_t, _ = tanh_parts(s * (scale / softcap))
            s = softcap * (one_plus_t - 1.0) * kLog2e
        else:
            s = s * scale_log2
        visible = col_valid[None, :] & ((window_left < 0) | (offs_n[None, :] >= query[:, None] + diag - window_left))
        visible = visible & ((window_right < 0) | (offs_n[None, :] <= query[:, None] + diag + window_right))
        s = tl.where(visible, s, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(s, axis=1))
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        p = tl.exp2(s - safe_max[:, None])
        alpha = tl.exp2(row_max - safe_max)
        p_v = to_dtype(p, v.dtype)
        row_sum = row_sum * alpha + tl.sum(p_v.to(tl.float32), axis=1)  # the values P V multiplies
        if DOT_IN_FP32:
            acc_o = acc_o * alpha[:, None] + tl.dot(p_v.to(tl.float32), v.to(tl.float32))
        else:
            acc_o = acc_o * alpha[:, None] + tl.dot(p_v, v)
        row_max = new_max
    empty = row_sum == 0.0
    out = acc_o / tl.where(empty, 1.0, row_sum)[:, None]
    lse = tl.where(empty, float("-inf"), (row_max + tl.log2(tl.where(empty, 1.0, row_sum))) * kLn2)
    # partials: o (splits, B, Sq, H, D) fp32, lse (splits, B, H, Sq)
    part = (split * batch + b).to(tl.int64)
    tl.store(O_PART + ((part * seqlen_q + query[:, None]) * H + head[:, None]) * head_dim + offs_d[None, :], out,
             mask=row_valid[:, None] & d_valid[None, :])
    tl.store(LSE_PART + (part * H + head) * seqlen_q + query, lse, mask=row_valid)


@triton.jit
def kvcache_append_kernel(
    K_NEW, V_NEW, K_CACHE, V_CACHE, CACHE_SEQLENS, BLOCK_TABLE,
    stride_knb, stride_kns, stride_knh, stride_vnb, stride_vns, stride_vnh,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
    seqlen_new, head_dim, page_size, num_pages, capacity,
    BLOCK_D: tl.constexpr, PAGED: tl.constexpr,
):
    """Program (batch · seqlen_new + t, kv head): new token t of sequence b into the caches at
    position cache_seqlens[b] + t (a negative length counts as 0), through the page table when
    PAGED (page ids clamped into [0, num_pages)); a token past the capacity is dropped."""
    b = tl.program_id(0) // seqlen_new
    t = tl.program_id(0) % seqlen_new
    h = tl.program_id(1)
    cached = tl.maximum(tl.load(CACHE_SEQLENS + b), 0)
    if cached < capacity - t:  # (not cached + t < capacity: no int32 overflow)
        pos = cached + t
        unit, slot = cache_slots(b, pos, True, BLOCK_TABLE, stride_bt, page_size, num_pages, PAGED)
        k_row = unit * stride_kp + slot * stride_ks
        v_row = unit * stride_vp + slot * stride_vs
        offs_d = tl.arange(0, BLOCK_D)
        d_valid = offs_d < head_dim
        k = tl.load(K_NEW + b.to(tl.int64) * stride_knb + t * stride_kns + h * stride_knh + offs_d, mask=d_valid)
        v = tl.load(V_NEW + b.to(tl.int64) * stride_vnb + t * stride_vns + h * stride_vnh + offs_d, mask=d_valid)
        tl.store(K_CACHE + k_row + h * stride_kh + offs_d, k, mask=d_valid)
        tl.store(V_CACHE + v_row + h * stride_vh + offs_d, v, mask=d_valid)


@triton.jit
def merge_splits_kernel(
    O_PART, LSE_PART, O, LSE, stride_ob, stride_os, stride_oh, seqlen_q, head_dim, num_splits, batch,
    H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program (batch · Sq + s, head): the N-way merge_attention_states of the splits' partial
    outputs (splits, B, Sq, H, D) and lse (splits, B, H, Sq): weights exp(lse_i − lse) with lse the
    logsumexp of the splits'; an empty split (lse −inf) weighs 0, all empty give 0 and −inf; a NaN
    lse makes the row NaN (as the CUDA combine: tl.maximum alone would drop it)."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    b = row // seqlen_q
    s = row % seqlen_q
    m = tl.full([], float("-inf"), dtype=tl.float32)
    nan = tl.full([], 0, dtype=tl.int1)
    for i in range(num_splits):
        lse_i = tl.load(LSE_PART + ((i * batch + b) * H + head) * seqlen_q + s)
        m = tl.maximum(m, lse_i)
        nan = nan | (lse_i != lse_i)
    empty = m == float("-inf")
    safe_m = tl.where(empty, 0.0, m)
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < head_dim
    total = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for i in range(num_splits):
        lse_i = tl.load(LSE_PART + ((i * batch + b) * H + head) * seqlen_q + s)
        w = tl.where(lse_i == float("-inf"), 0.0, tl.exp(lse_i - safe_m))
        o = tl.load(O_PART + (((i * batch + b) * seqlen_q + s) * H + head).to(tl.int64) * head_dim + offs_d,
                    mask=d_valid, other=0.0)
        acc += tl.where(w == 0.0, 0.0, w * o)  # an empty split's partial may hold anything
        total += w
    out = tl.where(empty, 0.0, acc / tl.where(empty, 1.0, total))
    out = tl.where(nan, float("nan"), out)
    tl.store(O + b.to(tl.int64) * stride_ob + s * stride_os + head * stride_oh + offs_d,
             to_dtype(out, O.dtype.element_ty), mask=d_valid)
    lse = tl.where(empty, float("-inf"), safe_m + tl.log(tl.where(empty, 1.0, total)))
    tl.store(LSE + (b * H + head) * seqlen_q + s, tl.where(nan, float("nan"), lse))


def attention_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
                           k: Tensor | None = None, v: Tensor | None = None, block_table: Tensor | None = None,
                           causal: bool = False, softmax_scale: float | None = None,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, num_splits: int = 1,
                           block_m: int = 16, block_n: int = 32) -> tuple[Tensor, Tensor]:
    """(out (B, Sq, H, D), lse (B, H, Sq)) of flashext.reference.attention_with_kvcache: new k, v are
    appended into the cache first (in place, a program per new token and KV head), then num_splits
    programs per row block each attend to a range of the keys, and a program per output row merges
    their partial results by their lse."""
    batch, seqlen_q, heads, head_dim = q.shape
    heads_kv = k_cache.shape[2]
    page_size = k_cache.shape[1]
    seqlen_new = 0 if k is None else k.shape[1]
    paged = block_table is not None
    capacity = block_table.shape[1] * page_size if paged else k_cache.shape[1]
    if seqlen_new and batch:
        kvcache_append_kernel[(batch * seqlen_new, heads_kv)](
            k, v, k_cache, v_cache, cache_seqlens, block_table if paged else cache_seqlens,
            k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2), block_table.stride(0) if paged else 0, seqlen_new, head_dim, page_size, k_cache.shape[0],
            capacity, BLOCK_D=_block_d(head_dim), PAGED=paged)
    split_keys = triton.cdiv(triton.cdiv(capacity, num_splits), block_n) * block_n
    group = heads // heads_kv
    o_part = torch.empty(num_splits, batch, seqlen_q, heads, head_dim, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(num_splits, batch, heads, seqlen_q, dtype=torch.float32, device=q.device)
    scale = _scale(head_dim, softmax_scale)
    left, right = _window(window_size, causal)
    grid = (triton.cdiv(seqlen_q * group, block_m), batch * heads_kv, num_splits)
    attention_kvcache_split_kernel[grid](
        q, k_cache, v_cache, cache_seqlens, block_table if paged else cache_seqlens, o_part, lse_part,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_table.stride(0) if paged else 0,
        seqlen_q, seqlen_new, head_dim, page_size, k_cache.shape[0], capacity, split_keys, scale,
        scale * math.log2(math.e), softcap, left, right, batch,
        H=heads, GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=_block_d(head_dim), PAGED=paged,
        HAS_SOFTCAP=softcap > 0, DOT_IN_FP32=_dot_in_fp32(q),
    )
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, seqlen_q, dtype=torch.float32, device=q.device)
    if out.numel():
        merge_splits_kernel[(batch * seqlen_q, heads)](
            o_part, lse_part, out, lse, out.stride(0), out.stride(1), out.stride(2), seqlen_q, head_dim, num_splits,
            batch, H=heads, BLOCK_D=_block_d(head_dim))
    return out, lse
