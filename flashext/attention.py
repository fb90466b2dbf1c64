"""FlashAttention: exact attention without an S × S matrix in HBM.

The CUDA kernels are csrc/kernels/attention/ (schemas in csrc/torch/registration.cpp, glue in
csrc/torch/attention.cpp, which also registers the checks and output shapes for tracing, the
autograd rules in csrc/torch/autograd.cpp); this module holds the public functions. The backward
recomputes the probabilities from q, k and the saved lse (only q, k, v, out and lse are saved).
Definition: flashext.reference.attention; Triton twin: flashext/triton_ref/attention.py.

Gradients: dk and dv are summed over the query heads that share a KV head inside the kernel, in a
fixed order; dq is summed over key blocks with fp32 atomics by default, so its last bits can vary
from run to run. deterministic=True (or torch.use_deterministic_algorithms(True)) orders those
additions instead: bitwise-identical gradients, somewhat slower.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._build import extension_loaded, ops

_ops = ops()  # torch.ops.flashext, or a stand-in that says the extension is not built


def _deterministic(deterministic: bool) -> bool:
    return deterministic or torch.are_deterministic_algorithms_enabled()


_HOPPER_MODES = (False, True, "always")  # flashext::HopperKernels: kOff, kWhereFaster, kAlways


def use_hopper_kernels(enabled: bool | str = True) -> bool | str:
    """Allow (True, the default) or forbid (False) the Hopper (sm_90a) attention kernels where they
    apply (on an H100/H200 with a build holding sm_90a code: the forward at head dims over 64, and
    at head dims up to 64 from 512 keys, where it is the faster; the backward at head dims up to
    128, dense or varlen). Forbidden, every call runs the portable FA2-design kernels, as on other
    GPUs: to compare the two, or as a fallback. "always": the Hopper kernels serve every call they
    can take, also where the portable ones are faster (the forward at D <= 64 under 512 keys): to
    test them on every shape. Process-wide and read as each call runs (under torch.compile too; a
    captured CUDA graph keeps the kernels of its capture). Returns the previous setting. The
    environment variable FLASHEXT_HOPPER=0 (or =always) sets the starting value."""
    from . import _build

    if enabled not in _HOPPER_MODES:
        raise ValueError(f"use_hopper_kernels: enabled must be True, False or 'always', got {enabled!r}")
    _build.require_extension()
    return _HOPPER_MODES[_build._C.set_hopper_kernels(_HOPPER_MODES.index(enabled))]


def _hopper_forward_available() -> bool:
    """Whether _flash_attention_sm90 runs here: an sm_90 GPU and a build holding sm_90a code."""
    if not extension_loaded() or not torch.cuda.is_available():
        return False
    from ._build import build_info

    return torch.cuda.get_device_capability() == (9, 0) and any("90a" in a for a in build_info()["cuda_archs"])


def _flash_attention_sm90(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, softmax_scale: float | None = None,
                          window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0) -> tuple[Tensor, Tensor]:
    """(out, lse) by the Hopper kernel (wgmma, TMA, warp specialisation) alone: head dims as
    flash_attention's (kernels for 64, 128 and 256, the others on the next of them), dense, forward
    only, on an sm_90 GPU with an sm_90a build (flash_attention uses it there at head dims over 64,
    and up to 64 from 512 keys). For its tests and bench_attention; not a public API."""
    return _ops._flash_attn_fwd_sm90(q, k, v, causal, softmax_scale, window_size[0], window_size[1], softcap)


def _flash_attention_backward_sm90(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                   causal: bool = False,
                                   softmax_scale: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) by the Hopper backward alone: head dims up to 128 (kernels for 64 and 128, the
    others on the next of them), dense, full or causal (this op's
    arguments; flash_attention's backward runs it for windows and soft-cap too), from the forward's
    out and lse, on an sm_90 GPU with an sm_90a build. For its tests; not a public API."""
    return _ops._flash_attn_bwd_sm90(dout, q, k, v, out, lse, causal, softmax_scale)


def flash_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, softmax_scale: float | None = None,
                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, return_lse: bool = False,
                    deterministic: bool = False):
    """softmax(q·kᵀ·softmax_scale) · v for q (B, Sq, H, D), k and v (B, Sk, Hkv, D), H % Hkv == 0.

    fp16/bf16, any strides with a contiguous last dim, head dim a multiple of 8 up to 256.
    causal and window_size = (left, right) are aligned bottom-right when Sq != Sk (flash-attn);
    softcap > 0 applies softcap · tanh(s / softcap) to the scaled scores. Returns out (B, Sq, H, D)
    and, with return_lse, the log-sum-exp (B, H, Sq) in fp32 (natural log; −inf for a query that
    sees no key, whose output is 0). Differentiable in q, k and v (and through the lse too);
    deterministic=True makes the gradients bitwise reproducible (see the module's docstring).
    """
    out, lse = _ops.flash_attn_fwd(q, k, v, causal, softmax_scale, window_size[0], window_size[1], softcap, False,
                                   _deterministic(deterministic))
    return (out, lse) if return_lse else out


def flash_attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                           softmax_scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                           softcap: float = 0.0, return_lse: bool = False, validate: bool | None = None,
                           deterministic: bool = False):
    """Packed ragged batch: q (total_q, H, D), k/v (total_k, Hkv, D); sequence b is rows
    cu_seqlens[b]:cu_seqlens[b + 1] (int32, B + 1 entries). Sequences of length 0 and 1 are fine.
    Returns out (total_q, H, D) and with return_lse the lse (H, total_q).

    validate (default: on, except during CUDA-graph capture or torch.compile tracing) checks the
    offsets' values — starting at 0, non-decreasing, within the tensors, no sequence longer than
    its max_seqlen — after the op's other checks, from one host copy (a sync). Without it the kernel
    still never reads or writes out of bounds (it clamps the offsets). Rows no sequence covers (past
    cu_seqlens_q[-1], or past max_seqlen_q) read 0 with lse −inf; only validated offsets that cover
    every row spare the output that fill. Differentiable in q, k and v like flash_attention.
    """
    if validate is None:  # not while tracing or capturing a graph (no host sync); meta: the op skips it
        validate = not (torch.compiler.is_compiling() or (q.is_cuda and torch.cuda.is_current_stream_capturing()))
    out, lse = _ops.flash_attn_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                          softmax_scale, window_size[0], window_size[1], softcap, validate,
                                          _deterministic(deterministic))
    return (out, lse) if return_lse else out


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """torch.nn.functional.scaled_dot_product_attention's signature and semantics on (B, H, S, D)
    tensors (is_causal is top-left aligned, as in torch), computed by the FlashAttention kernel on
    transposed views (no copies). A dense attn_mask and dropout are not supported: they raise."""
    fn = "flashext.scaled_dot_product_attention"
    if attn_mask is not None:
        raise NotImplementedError(f"{fn}: attn_mask is not supported; use is_causal, or flashext.flash_attention's "
                                  "window_size for sliding windows")
    if dropout_p != 0.0:
        raise NotImplementedError(f"{fn}: dropout_p must be 0.0 (dropout is not supported)")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise RuntimeError(f"{fn}: query, key and value must be 4-D (batch, heads, seqlen, head_dim)")
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise RuntimeError(f"{fn}: query has {query.shape[1]} heads and key {key.shape[1]}; pass enable_gqa=True "
                           "for grouped-query attention")
    # like_inputs: out (and the gradients) in the layout of query (key, value), as torch returns them
    out, _ = _ops.flash_attn_fwd(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), is_causal,
                                 scale, -1, -1, 0.0, True, _deterministic(False), True)
    return out.transpose(1, 2)


def flash_attention_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
                                 k: Tensor | None = None, v: Tensor | None = None, block_table: Tensor | None = None,
                                 causal: bool = False, softmax_scale: float | None = None,
                                 window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, num_splits: int = 0,
                                 return_lse: bool = False, validate: bool = False):
    """Attention of q (B, Sq, H, D) over each sequence's KV cache, in flash-attn's spirit (decode:
    Sq = 1; speculative or chunked prefill: a few hundred). Definition:
    flashext.reference.attention_with_kvcache.

    k_cache, v_cache: dense (B, capacity, Hkv, D), or paged (num_pages, page_size, Hkv, D) with
    block_table (B, pages_per_seq) int32 (any page size from 1). cache_seqlens (B,) int32 on the
    device: tokens already cached. k, v (B, S_new, Hkv, D): new tokens, written into the caches in
    place at each sequence's length, then attended too. The queries are the last Sq positions
    (causal and windows aligned bottom-right). Masks and options as flash_attention. num_splits:
    how many blocks share a sequence's keys (0: chosen from the shapes and the GPU, never from the
    device-side lengths, so no host sync: CUDA-graph safe). Lengths past the cache's capacity are
    clamped (new tokens past it are dropped; a negative length counts as 0), and page ids outside
    the cache are clamped into it: nothing is read or written outside the caches, whatever the
    values. validate=True checks them instead, before anything is written, from host copies of
    cache_seqlens and block_table (a sync, so not under CUDA-graph capture or torch.compile): a
    length that is negative or, with the new tokens, past the capacity, or a page id of the pages a
    sequence uses outside [0, num_pages), raises. Not differentiable (inference).
    """
    if validate and q.device.type != "meta":
        _validate_kvcache(cache_seqlens, block_table, k_cache, 0 if k is None else k.shape[1])
    out, lse = _ops.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal,
                                            softmax_scale, window_size[0], window_size[1], softcap, num_splits)
    return (out, lse) if return_lse else out


def _validate_kvcache(cache_seqlens: Tensor, block_table: Tensor | None, k_cache: Tensor, seqlen_new: int) -> None:
    """flash_attention_with_kvcache(validate=True)'s checks of the values (the op checks shapes,
    dtypes and devices; malformed arguments are left to it and its messages)."""
    fn = "flashext.flash_attention_with_kvcache"
    if torch.compiler.is_compiling() or (cache_seqlens.is_cuda and torch.cuda.is_current_stream_capturing()):
        raise RuntimeError(f"{fn}: validate=True copies cache_seqlens and block_table to the host, which neither "
                           "CUDA-graph capture nor torch.compile can; validate before capturing or compiling")
    if cache_seqlens.dim() != 1 or k_cache.dim() != 4 or (block_table is not None and (
            block_table.dim() != 2 or block_table.shape[0] != cache_seqlens.shape[0])):
        return
    lengths = cache_seqlens.to("cpu", torch.int64)
    negative = torch.nonzero(lengths < 0)
    if len(negative):
        b = int(negative[0])
        raise RuntimeError(f"{fn}: argument 'cache_seqlens' holds a negative length ({int(lengths[b])} at [{b}])")
    page_size = k_cache.shape[1]
    capacity = page_size if block_table is None else block_table.shape[1] * page_size
    totals = lengths + seqlen_new
    over = torch.nonzero(totals > capacity)
    if len(over):
        b = int(over[0])
        raise RuntimeError(f"{fn}: cache_seqlens[{b}] = {int(lengths[b])} plus {seqlen_new} new tokens is past the "
                           f"cache's capacity of {capacity} tokens per sequence")
    if block_table is None:
        return
    table = block_table.to("cpu", torch.int64)
    num_pages = k_cache.shape[0]
    used = torch.arange(table.shape[1])[None, :] < ((totals + page_size - 1) // page_size)[:, None]
    bad = torch.nonzero(used & ((table < 0) | (table >= num_pages)))
    if len(bad):
        b, j = (int(i) for i in bad[0])
        raise RuntimeError(f"{fn}: argument 'block_table' has page id {int(table[b, j])} at [{b}, {j}], outside the "
                           f"cache's {num_pages} pages")


def block_sparse_attention(q: Tensor, k: Tensor, v: Tensor, block_mask: Tensor, block_size: tuple[int, int],
                           causal: bool = False, softmax_scale: float | None = None,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, return_lse: bool = False):
    """flash_attention where query block i (R = block_size[0] rows) sees key block j (C =
    block_size[1] keys) only if block_mask[b, h, i, j]: block_mask bool (B or 1, H or 1, ⌈Sq/R⌉,
    ⌈Sk/C⌉), size-1 dims broadcast (FlashInfer's block-sparse layout; flashext.reference defines
    it). Combines with causal and windows (bottom-right, as flash_attention). Key blocks of the
    kernel that no set block touches are skipped, costing nothing; R and C multiples of the
    kernel's tiles (query × key tiles: 128 × 128 at D = 64, 128 × 64 at D = 128, 64 × 64 at D =
    256; 128 × 128 blocks suit all) need no per-element lookup. A query that
    sees no key outputs 0 with lse −inf. Forward only (no autograd formula yet).
    """
    rows, cols = block_size
    out, lse = _ops.flash_attn_block_sparse_fwd(q, k, v, block_mask, rows, cols, causal, softmax_scale,
                                                window_size[0], window_size[1], softcap)
    return (out, lse) if return_lse else out


def merge_attention_states(o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """Attention over the union of two disjoint key sets from each set's result: (o, lse) with
    lse = log(e^lse_a + e^lse_b) and o = e^(lse_a − lse)·o_a + e^(lse_b − lse)·o_b, in fp32.

    o_a, o_b: (B, S, H, D) as flash_attention returns, or (total, H, D) as the varlen one does (fp32,
    fp16 or bf16, head dim a multiple of 8); lse_a, lse_b: their natural-log lse, (B, H, S) or
    (H, total), fp32. A row with lse −inf on both sides gets o = 0 and lse −inf, never NaN; NaN in
    either lse makes the row NaN. This is how split-KV partial results are combined, and how
    cascade (shared-prefix) attention works: attend to the shared prefix once, to each suffix apart,
    merge. Not differentiable yet.
    """
    return _ops.merge_attention_states(o_a, lse_a, o_b, lse_b)


# The autograd rules of flash_attn_fwd and flash_attn_varlen_fwd are C++ Autograd kernels
# (csrc/torch/autograd.cpp: a Python one would cost tens of microseconds a call); shapes for tracing
# come from the C++ Meta registration, which runs the CUDA path's own checks (csrc/torch/attention.cpp).
# The forward-only ops refuse a backward here.
if extension_loaded():
    def _merge_no_backward(ctx, *grads):
        raise NotImplementedError("flashext.merge_attention_states: the backward pass is not implemented")

    torch.library.register_autograd("flashext::merge_attention_states", _merge_no_backward,
                                    setup_context=lambda ctx, inputs, output: None)

    def _block_sparse_no_backward(ctx, *grads):
        raise NotImplementedError("flashext.block_sparse_attention: the backward pass is not implemented")

    torch.library.register_autograd("flashext::flash_attn_block_sparse_fwd", _block_sparse_no_backward,
                                    setup_context=lambda ctx, inputs, output: None)
