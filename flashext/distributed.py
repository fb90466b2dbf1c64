"""Context parallelism: one sequence over the ranks of a torch.distributed group (ring attention).

    q, k, v = (flashext.distributed.zigzag_shard(t, rank, world_size) for t in (q, k, v))
    out = flashext.distributed.ring_attention(q, k, v, causal=True)      # this rank's rows
    full = flashext.distributed.zigzag_gather(out)                         # (optional) all rows

Each rank holds a shard of the sequence, (B, S / W, H, D) of q, k and v for W ranks. The K/V blocks
travel around the ring, each rank passing the block it holds to the next rank and receiving the
previous rank's while the current block's attention runs (isend / irecv of one packed tensor), and
the partial results merge by their log-sum-exp (merge_attention_states). The backward runs the
ring again from the merged output and lse: each rank adds its queries' dq, and the block's dk and
dv travel with the block and arrive home after a full turn. Memory per rank is O(S / W).

Causal attention needs the load-balanced ("zigzag") sharding: the sequence cut into 2W chunks of
C rows, rank r holding chunks r and 2W − 1 − r. Every step then costs every rank the same:
    its own block:        its two chunks against themselves, causal;
    a block of rank j < r: both query chunks against the block's first chunk, in full;
    a block of rank j > r: the second query chunk against the whole block, in full.
Attention without a mask works with the same sharding (or any other: it only needs every rank's
keys once). zigzag_shard cuts a sequence so; zigzag_gather reassembles the ranks' rows.

Kernels: flashext's on CUDA tensors (flash_attention with its lse, its backward from the merged out
and lse, merge_attention_states); on CPU tensors the reference's (flashext.reference), so that the
ring logic runs under the gloo backend (tests/test_distributed.py). `simulate_ring` runs the same
steps for W ranks in one process, without communication (the kernels' part, on one GPU).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from . import reference as ref

_FN = "flashext.distributed.ring_attention"


# ---- sharding ------------------------------------------------------------------------------------


def zigzag_shard(x: Tensor, rank: int, world_size: int, dim: int = 1) -> Tensor:
    """Rank `rank`'s rows of x along `dim` (the sequence): chunks rank and 2W − 1 − rank of 2W."""
    length = x.shape[dim]
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"flashext.distributed.zigzag_shard: rank {rank} is not in [0, world_size = {world_size})")
    if length % (2 * world_size) != 0:
        raise ValueError(f"flashext.distributed.zigzag_shard: the sequence length {length} (dim {dim} of 'x') must be "
                         f"divisible by 2 × world_size = {2 * world_size}; pad the sequence first")
    chunks = x.chunk(2 * world_size, dim)
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], dim).contiguous()


def zigzag_unshard(shards: list[Tensor], dim: int = 1) -> Tensor:
    """The whole sequence from every rank's zigzag_shard, in rank order."""
    world_size = len(shards)
    chunks: list[Tensor | None] = [None] * (2 * world_size)
    for rank, shard in enumerate(shards):
        chunks[rank], chunks[2 * world_size - 1 - rank] = shard.chunk(2, dim)
    return torch.cat(chunks, dim)


def zigzag_gather(x: Tensor, group: dist.ProcessGroup | None = None, dim: int = 1) -> Tensor:
    """The whole sequence on every rank, from each rank's zigzag rows x (an all_gather)."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return zigzag_unshard(parts, dim)


# ---- one block's kernels -----------------------------------------------------------------------


def _cpu_dtype(q: Tensor) -> torch.dtype:
    """The precision of the sums (and of the reference on CPU): float64 for float64 inputs, else float32."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _block_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, softcap: float) -> tuple[Tensor, Tensor]:
    """(out fp32, lse) of q against one key block."""
    if q.is_cuda:
        from .attention import flash_attention

        out, lse = flash_attention(q, k, v, causal=causal, softmax_scale=scale, softcap=softcap, return_lse=True)
        return out.float(), lse
    out, lse = ref.attention(q, k, v, causal=causal, softmax_scale=scale, softcap=softcap, return_lse=True,
                             compute_dtype=_cpu_dtype(q))
    return out, lse


def _merge(out: Tensor | None, lse: Tensor | None, o_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    if out is None:
        return o_b, lse_b
    if out.is_cuda:
        from .attention import merge_attention_states

        return merge_attention_states(out.contiguous(), lse.contiguous(), o_b.contiguous(), lse_b.contiguous())
    o, merged = ref.merge_attention_states(out, lse, o_b, lse_b)
    return o.to(out.dtype), merged.float()


def _block_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool,
                    scale: float, softcap: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv), fp32, of q's rows against one key block, given the whole row's out and lse:
    dS = P ∘ (dP − D) with P = exp(S − lse) and D = rowsum(dO ∘ out) over every key, not the block's."""
    if q.is_cuda:
        from .attention import _ops

        dq, dk, dv = _ops.flash_attn_bwd(dout, q, k, v, out, lse, None, causal, scale, -1, -1, softcap, False,
                                         torch.are_deterministic_algorithms_enabled(), False)
        return dq.float(), dk.float(), dv.float()
    # The reference's backward of the block alone, rescaled to the whole row: with the block's own
    # (o_b, lse_b) and w = exp(lse_b − lse), P = w · P_b, so feeding dout · w and dlse = w ·
    # (rowsum(dO ∘ o_b) − D) into its dS = P_b ∘ (dP − rowsum(P_b ∘ dP) + dlse) gives P ∘ (dP − D).
    o_b, lse_b = ref.attention(q, k, v, causal=causal, softmax_scale=scale, softcap=softcap, return_lse=True,
                               compute_dtype=_cpu_dtype(q))
    dtype = _cpu_dtype(q)
    w = torch.where(lse_b == -math.inf, torch.zeros_like(lse_b), torch.exp(lse_b - lse)).to(dtype)  # (B, H, S)
    w_rows = w.transpose(1, 2).unsqueeze(-1)  # (B, S, H, 1)
    d_all = (dout.to(dtype) * out.to(dtype)).sum(-1)  # (B, S, H)
    d_block = (dout.to(dtype) * o_b).sum(-1)
    dlse = (w.transpose(1, 2) * (d_block - d_all)).transpose(1, 2)
    dq, dk, dv = ref.attention_backward(dout.to(dtype) * w_rows, q, k, v, causal=causal, softmax_scale=scale,
                                        softcap=softcap, dlse=dlse, compute_dtype=_cpu_dtype(q))
    return dq, dk, dv


# ---- the steps of the ring -----------------------------------------------------------------------
#
# Rank r at step s holds the K/V block of rank (r − s) mod W. What it computes there depends only on
# (r, source rank, causal): the same for the distributed driver and for simulate_ring.


def _forward_step(q: Tensor, k: Tensor, v: Tensor, rank: int, source: int, causal: bool, scale: float,
                  softcap: float, out: Tensor | None, lse: Tensor | None) -> tuple[Tensor, Tensor]:
    if not causal:
        return _merge(out, lse, *_block_forward(q, k, v, False, scale, softcap))
    half = q.shape[1] // 2
    if source == rank:
        return _merge(out, lse, *_block_forward(q, k, v, True, scale, softcap))
    if source < rank:  # both query chunks see the block's first chunk
        return _merge(out, lse, *_block_forward(q, k[:, :half], v[:, :half], False, scale, softcap))
    # source > rank: the second query chunk sees the whole block (the first one's rows are set by step 0)
    # (out and lse are this ring's own running result: updated in place)
    o_b, lse_b = _block_forward(q[:, half:], k, v, False, scale, softcap)
    out[:, half:], lse[:, :, half:] = _merge(out[:, half:], lse[:, :, half:], o_b, lse_b)
    return out, lse


def _backward_step(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, rank: int, source: int,
                   causal: bool, scale: float, softcap: float, dq: Tensor, dkv: Tensor) -> None:
    """Adds the step's dq (this rank's rows) and the block's dk, dv (into dkv = [dk, dv])."""
    half = q.shape[1] // 2
    if not causal or source == rank:
        gq, gk, gv = _block_backward(dout, q, k, v, out, lse, causal, scale, softcap)
        dq += gq
        dkv[0] += gk
        dkv[1] += gv
    elif source < rank:
        gq, gk, gv = _block_backward(dout, q, k[:, :half], v[:, :half], out, lse, False, scale, softcap)
        dq += gq
        dkv[0][:, :half] += gk
        dkv[1][:, :half] += gv
    else:
        gq, gk, gv = _block_backward(dout[:, half:], q[:, half:], k, v, out[:, half:], lse[:, :, half:], False, scale,
                                     softcap)
        dq[:, half:] += gq
        dkv[0] += gk
        dkv[1] += gv


# ---- the distributed driver ----------------------------------------------------------------------


class _Ring:
    """The ranks next and before this one in the group, as global ranks (P2P ops take those)."""

    def __init__(self, group: dist.ProcessGroup | None):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size) if group is not None else \
            (self.rank + 1) % self.size
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size) if group is not None else \
            (self.rank - 1) % self.size

    def pass_on(self, tensor: Tensor) -> tuple[Tensor, list]:
        """Starts sending `tensor` to the next rank and receiving the previous rank's into a new
        buffer; returns the buffer and the requests to wait on."""
        received = torch.empty_like(tensor)
        ops = [dist.P2POp(dist.isend, tensor, self.next, self.group),
               dist.P2POp(dist.irecv, received, self.prev, self.group)]
        return received, dist.batch_isend_irecv(ops)


def _wait(requests: list) -> None:
    for request in requests:
        request.wait()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, scale, softcap):
        ring = _Ring(group)
        kv = torch.stack([k, v]).contiguous()
        out = lse = None
        for step in range(ring.size):
            if step + 1 < ring.size:  # the next block comes in while this one is computed
                incoming, requests = ring.pass_on(kv)
            out, lse = _forward_step(q, kv[0], kv[1], ring.rank, (ring.rank - step) % ring.size, causal, scale,
                                     softcap, out, lse)
            if step + 1 < ring.size:
                _wait(requests)
                kv = incoming
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.scale, ctx.softcap = group, causal, scale, softcap
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.group)
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=_cpu_dtype(q), device=q.device)
        kv = torch.stack([k, v]).contiguous()
        # The held block's [dk, dv] go on with it. This step's share is computed into a fresh
        # buffer while the ranks before have the block's sum so far in flight; it arrives and is
        # added after the kernel, then the sum is passed on. After the last step it reaches the
        # block's owner.
        received = None
        for step in range(ring.size):
            last = step + 1 == ring.size
            if not last:
                incoming, kv_requests = ring.pass_on(kv)
            dkv = torch.zeros(kv.shape, dtype=_cpu_dtype(q), device=q.device)
            _backward_step(dout, q, kv[0], kv[1], out, lse, ring.rank, (ring.rank - step) % ring.size, ctx.causal,
                           ctx.scale, ctx.softcap, dq, dkv)
            if received is not None:
                _wait(dkv_requests)
                dkv += received
            if ring.size == 1:  # (a ring of one: the block is its own)
                return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None
            received, dkv_requests = ring.pass_on(dkv)
            if not last:
                _wait(kv_requests)
                kv = incoming
        _wait(dkv_requests)
        return dq.to(q.dtype), received[0].to(k.dtype), received[1].to(v.dtype), None, None, None, None


def _check(q: Tensor, k: Tensor, v: Tensor, causal: bool, window_size: tuple[int, int]) -> None:
    if tuple(window_size) != (-1, -1):
        raise ValueError(f"{_FN}: argument 'window_size' must be (-1, -1) (sliding windows over the ring are not "
                         f"supported yet), got {tuple(window_size)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{_FN}: argument '{name}' must be 4-D (batch, seqlen / world_size, heads, head_dim), "
                             f"got shape {tuple(t.shape)}")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[1] != k.shape[1] or q.shape[3] != k.shape[3]:
        raise ValueError(f"{_FN}: arguments 'q' {tuple(q.shape)}, 'k' {tuple(k.shape)} and 'v' {tuple(v.shape)} must "
                         "be shards of one sequence: the same batch, rows and head dim (k, v the same shape)")
    if q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"{_FN}: the number of query heads ({q.shape[2]}) must be a multiple of the KV heads' "
                         f"({k.shape[2]})")
    if causal and q.shape[1] % 2 != 0:
        raise ValueError(f"{_FN}: causal attention takes zigzag shards (zigzag_shard), two chunks of equal length; "
                         f"got {q.shape[1]} rows")


def ring_attention(q: Tensor, k: Tensor, v: Tensor, group: dist.ProcessGroup | None = None, causal: bool = False,
                   softmax_scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                   softcap: float = 0.0) -> Tensor:
    """Attention of this rank's query rows over the whole sequence, whose K/V shards the group's
    ranks hold: q (B, S / W, H, D), k and v (B, S / W, Hkv, D), every rank the same shapes; with
    causal=True the shards must be zigzag_shard's. Returns this rank's rows of the output, (B, S /
    W, H, D); differentiable (the gradients of this rank's q, k and v). Every rank of the group
    must call it (collective). A rank's place in the ring, and so its shard, is its rank in the
    group, dist.get_rank(group) (new_group sorts the ranks it is given). The backward honours
    torch.use_deterministic_algorithms."""
    _check(q, k, v, causal, window_size)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return _RingAttention.apply(q, k, v, group, causal, scale, float(softcap))


def simulate_ring(qs: list[Tensor], ks: list[Tensor], vs: list[Tensor], causal: bool = False,
                  softmax_scale: float | None = None, softcap: float = 0.0,
                  douts: list[Tensor] | None = None) -> tuple[list[Tensor], list | None]:
    """ring_attention's steps for len(qs) ranks in one process, without communication: every
    rank's output and, given douts, every rank's (dq, dk, dv). The kernels' part of the ring (each
    step's blocks, the merges, the backward from the merged statistics), for one GPU."""
    world = len(qs)
    for q, k, v in zip(qs, ks, vs):
        _check(q, k, v, causal, (-1, -1))
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(qs[0].shape[-1])
    outs, lses = [None] * world, [None] * world
    for step in range(world):
        for rank in range(world):
            source = (rank - step) % world
            outs[rank], lses[rank] = _forward_step(qs[rank], ks[source], vs[source], rank, source, causal, scale,
                                                   softcap, outs[rank], lses[rank])
    outs = [o.to(q.dtype) for o, q in zip(outs, qs)]
    if douts is None:
        return outs, None
    dqs = [torch.zeros(q.shape, dtype=_cpu_dtype(q), device=q.device) for q in qs]
    dkvs = [torch.zeros((2, *k.shape), dtype=_cpu_dtype(k), device=k.device) for k in ks]  # by source rank
    for step in range(world):
        for rank in range(world):
            source = (rank - step) % world
            _backward_step(douts[rank].contiguous(), qs[rank], ks[source], vs[source], outs[rank], lses[rank], rank,
                           source, causal, scale, softcap, dqs[rank], dkvs[source])
    grads = [(dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(k.dtype)) for dq, dkv, q, k in zip(dqs, dkvs, qs, ks)]
    return outs, grads
