"""FlashAttention forward against its anchors, same process, same inputs (ANCHORS.md).

    python benchmarks/bench_attention.py [--quick] [--only fwd,train,memory,softmax,sparse]

fwd     TFLOP/s (4·B·H·S²·D, halved when causal; B·S = 16384 tokens, H = 2048 / D) for fp16/bf16,
        D ∈ {64, 128, 256}, causal and not, S = 512 … 16384: flashext, its Triton twin, SDPA's
        flash (FA2), cuDNN and memory-efficient backends and SDPA with no backend chosen
        (sdpa_default), FlexAttention (fp16, D = 128 only:
        each shape compiles) and, on sm_90, flashext_sm90 and flashext_fa2 (the Hopper kernel alone
        and the FA2-design kernel alone; flashext is what flash_attention's dispatch picks). Each implementation is first checked against flashext.reference
        on the last 256 query rows (which see every key) by the tolerance rule, then timed in
        rounds whose order is balanced (each follows each other equally often); median round.
        Beside it, the dense matmul ceiling of each dtype (8192³ a @ b), as rows of section matmul.
train   forward + backward and the backward alone, TFLOP/s (forward 4·B·H·S²·D, backward 2.5× that,
        halved when causal), same grid as fwd: flashext, its Triton twin, SDPA's flash and cuDNN
        backends and SDPA with no backend chosen (what a training script gets), and on sm_90 at
        D = 64 and 128 flashext_sm90 (flash_attention's forward with the Hopper backward alone)
        and flashext_fa2 (forward and backward on the FA2-design kernels, the portable path);
        when named in FLASHEXT_BENCH_IMPLS, flashext_deterministic (deterministic=True as
        dispatched) and flashext_fa2_deterministic (on the FA2-design kernels).
        Gradients are checked first against flashext.reference.attention_backward on one (batch,
        head) slice.
memory  peak extra memory of one forward, and of forward + backward, at B = H = 1, D = 128, fp16:
        flashext against SDPA's math backend (which materialises the S × S scores) and, for the
        backward, SDPA's flash backend, S = 4096 … 65536.
softmax online_softmax against torch.softmax, GB/s (one read, one write), rows of 4096 … 65536.
sparse  block_sparse_attention at 10 / 50 / 100 % block density (128 × 128 and 64 × 64 blocks)
        against dense flash_attention, bf16, D = 128, S = 4096 and 16384 (not in the default run).
Writes attention.json and attention.png to $OUT (or benchmarks/results); without fwd in --only,
attention_<sections>.json (and with train, its .png).
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import flashext  # noqa: E402
from benchmarks.common import bench_ms, bench_rounds, output_dir, parse_args, run_metadata, write_json  # noqa: E402
from flashext import attention, reference as ref  # noqa: E402
from flashext.testing import GRADIENT_FACTOR, judge  # noqa: E402
from flashext.triton_ref import attention as twin  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
CHECK_ROWS = 256


def sdpa_default(q, k, v, causal):
    """F.scaled_dot_product_attention with no backend chosen: what a user gets (cuDNN's kernel on an
    H100/H200)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def sdpa_backend(backend):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def implementations(dname: str, head_dim: int):
    from torch.nn.attention import SDPBackend

    impls = {
        # (function of (q, k, v, causal) in its own layout, layout): "bshd" (B, S, H, D) or "bhsd"
        "flashext": (lambda q, k, v, causal: flashext.flash_attention(q, k, v, causal=causal), "bshd"),
        "triton_twin": (lambda q, k, v, causal: twin.flash_attention(q, k, v, causal=causal)[0], "bshd"),
        "sdpa_flash": (sdpa_backend(SDPBackend.FLASH_ATTENTION), "bhsd"),
        "sdpa_cudnn": (sdpa_backend(SDPBackend.CUDNN_ATTENTION), "bhsd"),
        "sdpa_mem_efficient": (sdpa_backend(SDPBackend.EFFICIENT_ATTENTION), "bhsd"),
        "sdpa_default": (sdpa_default, "bhsd"),
    }
    if attention._hopper_forward_available():  # the Hopper kernel alone, and the FA2-design one alone
        impls["flashext_sm90"] = (lambda q, k, v, causal: attention._flash_attention_sm90(q, k, v, causal=causal)[0],
                                  "bshd")

        def run_fa2(q, k, v, causal):
            previous = flashext.use_hopper_kernels(False)
            try:
                return flashext.flash_attention(q, k, v, causal=causal)
            finally:
                flashext.use_hopper_kernels(previous)
        impls["flashext_fa2"] = (run_fa2, "bshd")
    if dname == "fp16" and head_dim == 128:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        flex = torch.compile(flex_attention, dynamic=False)
        masks = {}  # built once per shape, outside the timed call

        def run_flex(q, k, v, causal):
            key = (q.shape[2], k.shape[2], causal)
            if key not in masks:
                masks[key] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, q.shape[2], k.shape[2],
                                               device="cuda") if causal else None
            return flex(q, k, v, block_mask=masks[key])
        impls["flex_attention"] = (run_flex, "bhsd")
    return impls


def section_fwd(rows, quick: bool):
    seqlens = [1024, 16384] if quick else [512, 1024, 2048, 4096, 8192, 16384]
    head_dims = [128] if quick else [64, 128, 256]
    # A/B runs narrow the grid: FLASHEXT_BENCH_SEQLENS=1024,16384 FLASHEXT_BENCH_HEAD_DIMS=64
    # FLASHEXT_BENCH_DTYPES=bf16 FLASHEXT_BENCH_IMPLS=flashext,sdpa_flash
    env = lambda name, default: [x for x in os.environ.get(name, "").split(",") if x] or default
    seqlens = [int(x) for x in env("FLASHEXT_BENCH_SEQLENS", seqlens)]
    head_dims = [int(x) for x in env("FLASHEXT_BENCH_HEAD_DIMS", head_dims)]
    for dname, dtype in DTYPES.items():
        if dname not in env("FLASHEXT_BENCH_DTYPES", list(DTYPES)):
            continue
        # the dense matmul ceiling of this dtype in the same run (ANCHORS.md's 8192³ a @ b)
        a, b = (torch.randn(8192, 8192, device="cuda").to(dtype) for _ in range(2))
        ms = bench_ms(lambda: a @ b)
        rows.append({"section": "matmul", "dtype": dname, "shape": [8192, 8192, 8192], "ms": ms,
                     "tflops": 2 * 8192**3 / ms / 1e9})
        print(f"matmul {dname} 8192^3: {rows[-1]['tflops']:.0f} TFLOP/s", flush=True)
        del a, b
        for head_dim in head_dims:
            heads = 2048 // head_dim
            impls = implementations(dname, head_dim)
            impls = {name: impl for name, impl in impls.items() if name in env("FLASHEXT_BENCH_IMPLS", list(impls))}
            for causal in (False, True):
                for seqlen in seqlens:
                    batch = 16384 // seqlen
                    q = torch.randn(batch, seqlen, heads, head_dim, device="cuda").to(dtype)
                    k = torch.randn(batch, seqlen, heads, head_dim, device="cuda").to(dtype)
                    v = torch.randn(batch, seqlen, heads, head_dim, device="cuda").to(dtype)
                    layouts = {"bshd": (q, k, v), "bhsd": tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))}
                    tail = slice(seqlen - CHECK_ROWS, seqlen)
                    want = ref.attention(q[:, tail], k, v, causal=causal)
                    base = ref.attention(q[:, tail], k, v, causal=causal, compute_dtype=dtype)
                    flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
                    row = {"section": "fwd", "dtype": dname, "head_dim": head_dim, "causal": causal,
                           "seqlen": seqlen, "batch": batch, "heads": heads, "flops": flops}
                    timed = {}
                    for name, (fn, layout) in impls.items():
                        args = layouts[layout]
                        try:
                            out = fn(*args, causal)
                            out_bshd = out if layout == "bshd" else out.transpose(1, 2)
                            verdict = judge(name, out_bshd[:, tail], want, base)
                            row[name] = {"valid": verdict.ok, "error": verdict.error, "allowed": verdict.allowed}
                            timed[name] = lambda fn=fn, args=args: fn(*args, causal)
                        except Exception as exc:  # an anchor that does not run here: say so, keep going
                            row[name] = {"error_message": f"{type(exc).__name__}: {str(exc)[:200]}"}
                    # Rounds in a balanced order (bench_rounds): every implementation follows
                    # every other equally often, since what ran just before moves a kernel's time
                    # by several percent (D = 256: ours 3.6% slower right after mem-efficient
                    # than after a pause); the median of the rounds is reported.
                    for name, (ms, times) in bench_rounds(timed).items():
                        row[name].update(ms=ms, tflops=flops / ms / 1e9, rounds_ms=times)
                    rows.append(row)
                    print_row(row)
                    del q, k, v, layouts, want, base


def train_implementations():
    """name -> (forward of (q, k, v, causal) that autograd differentiates, layout, or for the twin,
    (forward, backward) functions called explicitly)."""
    from torch.nn.attention import SDPBackend

    impls = {
        "flashext": (lambda q, k, v, causal: flashext.flash_attention(q, k, v, causal=causal), "bshd"),
        "sdpa_flash": (sdpa_backend(SDPBackend.FLASH_ATTENTION), "bhsd"),
        "sdpa_cudnn": (sdpa_backend(SDPBackend.CUDNN_ATTENTION), "bhsd"),
        "sdpa_default": (sdpa_default, "bhsd"),
    }
    # deterministic=True (dQ added in key block order): as dispatched, and on the FA2-design kernels
    impls["flashext_deterministic"] = (
        lambda q, k, v, causal: flashext.flash_attention(q, k, v, causal=causal, deterministic=True), "bshd")
    if attention._hopper_forward_available():  # the Hopper backward alone (D = 64 and 128; refused elsewhere)
        impls["flashext_sm90"] = (HopperBackward.apply, "bshd")
        impls["flashext_fa2"] = (lambda q, k, v, causal: Portable.apply(q, k, v, causal, False), "bshd")
        impls["flashext_fa2_deterministic"] = (lambda q, k, v, causal: Portable.apply(q, k, v, causal, True), "bshd")
    return impls


class Portable(torch.autograd.Function):
    """flash_attention with the Hopper kernels forbidden in the forward and in the backward (which
    autograd runs after the call returns): the FA2-design kernels, what GPUs other than Hopper run;
    the columns flashext_fa2 and (deterministic) flashext_fa2_deterministic of the train section."""

    @staticmethod
    def forward(ctx, q, k, v, causal, deterministic):
        previous = flashext.use_hopper_kernels(False)
        try:
            with torch.enable_grad():
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                out = flashext.flash_attention(qg, kg, vg, causal=causal, deterministic=deterministic)
        finally:
            flashext.use_hopper_kernels(previous)
        ctx.graph = (qg, kg, vg, out)
        return out.detach()

    @staticmethod
    def backward(ctx, dout):
        qg, kg, vg, out = ctx.graph
        previous = flashext.use_hopper_kernels(False)
        try:
            return (*torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True), None, None)
        finally:
            flashext.use_hopper_kernels(previous)


class HopperBackward(torch.autograd.Function):
    """flash_attention's forward, then the Hopper backward by its private op (full or causal; the
    one flash_attention's backward runs at D = 64 and 128): the column flashext_sm90 of the train
    section."""

    @staticmethod
    def forward(ctx, q, k, v, causal):
        if q.shape[-1] not in (64, 128):
            raise ValueError(f"the Hopper backward takes head dim 64 or 128, got {q.shape[-1]}")
        out, lse = flashext.flash_attention(q, k, v, causal=causal, return_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        return (*attention._flash_attention_backward_sm90(dout, q, k, v, out, lse, causal=ctx.causal), None)


def section_train(rows, quick: bool):
    seqlens = [1024, 16384] if quick else [512, 1024, 2048, 4096, 8192, 16384]
    head_dims = [128] if quick else [64, 128, 256]
    env = lambda name, default: [x for x in os.environ.get(name, "").split(",") if x] or default  # noqa: E731
    seqlens = [int(x) for x in env("FLASHEXT_BENCH_SEQLENS", seqlens)]
    head_dims = [int(x) for x in env("FLASHEXT_BENCH_HEAD_DIMS", head_dims)]
    impls = train_implementations()
    default = [name for name in impls if "deterministic" not in name] + ["triton_twin"]  # (those: when named)
    impls = {name: impl for name, impl in impls.items() if name in env("FLASHEXT_BENCH_IMPLS", default)}
    with_twin = "triton_twin" in env("FLASHEXT_BENCH_IMPLS", list(impls) + ["triton_twin"])
    for dname, dtype in DTYPES.items():
        if dname not in env("FLASHEXT_BENCH_DTYPES", list(DTYPES)):
            continue
        for head_dim in head_dims:
            heads = 2048 // head_dim
            for causal in (False, True):
                for seqlen in seqlens:
                    batch = 16384 // seqlen
                    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda").to(dtype) for _ in range(3))
                    dout = torch.randn(batch, seqlen, heads, head_dim, device="cuda").to(dtype)
                    # the reference on (batch 0, head 0): heads are independent here
                    one = lambda t: t[:1, :, :1]  # noqa: E731
                    want = ref.attention_backward(one(dout), one(q), one(k), one(v), causal=causal)
                    base = ref.attention_backward(one(dout), one(q), one(k), one(v), causal=causal, compute_dtype=dtype)
                    flops_fwd = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
                    row = {"section": "train", "dtype": dname, "head_dim": head_dim, "causal": causal,
                           "seqlen": seqlen, "batch": batch, "heads": heads, "flops_fwd": flops_fwd}
                    fwd_bwd, bwd = {}, {}
                    for name, (fn, layout) in impls.items():
                        to = (lambda t: t) if layout == "bshd" else (lambda t: t.transpose(1, 2).contiguous())
                        qi, ki, vi = (to(t).detach().requires_grad_() for t in (q, k, v))
                        di = to(dout)
                        try:
                            out = fn(qi, ki, vi, causal)
                            grads = torch.autograd.grad(out, (qi, ki, vi), di, retain_graph=True)
                            back = (lambda t: t) if layout == "bshd" else (lambda t: t.transpose(1, 2))
                            row[name] = {}
                            for gname, g, w, b in zip(("dq", "dk", "dv"), grads, want, base):
                                verdict = judge(f"{name} {gname}", one(back(g)), w, b, factor=GRADIENT_FACTOR)
                                row[name][f"{gname}_valid"] = verdict.ok
                                row[name][f"{gname}_error"] = verdict.error
                            row[name]["valid"] = all(row[name][f"{g}_valid"] for g in ("dq", "dk", "dv"))
                            fwd_bwd[name] = lambda fn=fn, qi=qi, ki=ki, vi=vi, di=di: torch.autograd.grad(
                                fn(qi, ki, vi, causal), (qi, ki, vi), di)
                            bwd[name] = lambda out=out, qi=qi, ki=ki, vi=vi, di=di: torch.autograd.grad(
                                out, (qi, ki, vi), di, retain_graph=True)
                        except Exception as exc:  # an anchor that does not run here: say so, keep going
                            row[name] = {"error_message": f"{type(exc).__name__}: {str(exc)[:200]}"}
                    if with_twin:
                        try:
                            out_t, lse_t = twin.flash_attention(q, k, v, causal=causal)
                            g = twin.flash_attention_backward(dout, q, k, v, out_t, lse_t, causal=causal)
                        except Exception as exc:
                            row["triton_twin"] = {"error_message": f"{type(exc).__name__}: {str(exc)[:200]}"}
                            g = None
                    if with_twin and g is not None:
                        row["triton_twin"] = {"valid": all(judge("twin", one(x), w, b, factor=GRADIENT_FACTOR).ok
                                                           for x, w, b in zip(g, want, base))}

                        def twin_fwd_bwd(q=q, k=k, v=v, dout=dout):
                            o, lse = twin.flash_attention(q, k, v, causal=causal)
                            return twin.flash_attention_backward(dout, q, k, v, o, lse, causal=causal)
                        fwd_bwd["triton_twin"] = twin_fwd_bwd
                        bwd["triton_twin"] = lambda q=q, k=k, v=v, dout=dout: twin.flash_attention_backward(
                            dout, q, k, v, out_t, lse_t, causal=causal)
                    for label, fns, flops in (("fwd_bwd", fwd_bwd, 3.5 * flops_fwd), ("bwd", bwd, 2.5 * flops_fwd)):
                        # fewer calls per round than fwd: five implementations, two timings, 72 points
                        for name, (ms, times) in bench_rounds(fns, warmup=2, rep=5).items():
                            row[name].update({f"{label}_ms": ms, f"{label}_tflops": flops / ms / 1e9,
                                              f"{label}_rounds_ms": times})
                    rows.append(row)
                    cells = [f"{n} {c['fwd_bwd_tflops']:4.0f}/{c['bwd_tflops']:4.0f}" + ("" if c["valid"] else "(INVALID)")
                             for n, c in row.items() if isinstance(c, dict) and "fwd_bwd_tflops" in c]
                    print(f"train {dname} D={head_dim:3d} {'causal' if causal else 'full  '} S={seqlen:5d} "
                          f"fwd+bwd/bwd TFLOP/s: " + "  ".join(cells), flush=True)
                    del q, k, v, dout, want, base, fwd_bwd, bwd
                    torch.cuda.empty_cache()


def section_memory(rows, quick: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for seqlen in ([4096, 16384] if quick else [4096, 16384, 65536]):
        q = torch.randn(1, seqlen, 1, 128, device="cuda", dtype=torch.float16)
        row = {"section": "memory", "seqlen": seqlen}
        for name in ("flashext", "sdpa_math"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            try:
                if name == "flashext":
                    out = flashext.flash_attention(q, q, q)
                else:
                    qt = q.transpose(1, 2)
                    before = torch.cuda.memory_allocated()
                    with sdpa_kernel(SDPBackend.MATH):
                        out = F.scaled_dot_product_attention(qt, qt, qt)
                torch.cuda.synchronize()
                row[name] = {"peak_extra_mib": (torch.cuda.max_memory_allocated() - before) / 2**20}
                del out
            except torch.OutOfMemoryError:
                row[name] = {"error_message": "out of memory"}
        rows.append(row)
        print(f"memory S={seqlen}: " + "  ".join(f"{k} {v.get('peak_extra_mib', float('nan')):.0f} MiB"
                                                 for k, v in row.items() if isinstance(v, dict)), flush=True)
        torch.cuda.empty_cache()
        # forward + backward: extra memory beyond q, k, v and dout
        row = {"section": "memory_train", "seqlen": seqlen}
        dout = torch.randn_like(q)
        for name in ("flashext", "sdpa_flash", "sdpa_math"):
            qg, kg, vg = (q.clone().requires_grad_() for _ in range(3))
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            try:
                if name == "flashext":
                    grads = torch.autograd.grad(flashext.flash_attention(qg, kg, vg), (qg, kg, vg), dout)
                else:
                    backend = SDPBackend.FLASH_ATTENTION if name == "sdpa_flash" else SDPBackend.MATH
                    with sdpa_kernel(backend):
                        out = F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2))
                        grads = torch.autograd.grad(out, (qg, kg, vg), dout.transpose(1, 2))
                torch.cuda.synchronize()
                row[name] = {"peak_extra_mib": (torch.cuda.max_memory_allocated() - before) / 2**20}
                del grads
            except torch.OutOfMemoryError:
                row[name] = {"error_message": "out of memory"}
            del qg, kg, vg
            torch.cuda.empty_cache()
        rows.append(row)
        print(f"memory fwd+bwd S={seqlen}: " + "  ".join(f"{k} {v.get('peak_extra_mib', float('nan')):.0f} MiB"
                                                         for k, v in row.items() if isinstance(v, dict)), flush=True)


def section_softmax(rows, quick: bool):
    """online_softmax against torch.softmax: GB/s counting one read and one write."""
    for dname, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for cols in ([4096, 65536] if quick else [4096, 8192, 16384, 32768, 65536]):
            x = (torch.randn(2**27 // cols, cols, device="cuda") * 4).to(dtype)
            nbytes = 2 * x.numel() * x.element_size()
            want, base = torch.softmax(x.double(), -1), torch.softmax(x, -1)
            row = {"section": "softmax", "dtype": dname, "rows": x.shape[0], "cols": cols, "bytes": nbytes}
            for name, fn in (("flashext", lambda x=x: flashext.online_softmax(x)), ("torch", lambda x=x: torch.softmax(x, -1))):
                verdict = judge(name, fn(), want, base)
                ms = bench_ms(fn)
                row[name] = {"ms": ms, "gbps": nbytes / ms / 1e6, "valid": verdict.ok}
            rows.append(row)
            print(f"softmax {dname} {x.shape[0]}x{cols}: flashext {row['flashext']['gbps']:.0f} GB/s"
                  f"{'' if row['flashext']['valid'] else ' (INVALID)'}, torch {row['torch']['gbps']:.0f} GB/s, "
                  f"{row['torch']['ms'] / row['flashext']['ms']:.2f}x", flush=True)
            del x, want, base


def section_sparse(rows, quick: bool):
    """block_sparse_attention at block densities 10 %, 50 % and 100 % (random blocks, the same mask
    for every batch entry and head) against dense flash_attention on the same inputs: time ratio
    dense / sparse (bar: ≥ 5× at 10 %, ≥ 0.9× at 100 %). Block sizes 128 × 128 (the kernel's tiles)
    and 64 × 64; bf16, D = 128, B · S = 16384, H = 16, non-causal."""
    for seqlen in ([8192] if quick else [4096, 16384]):
        batch, heads, head_dim = 16384 // seqlen, 16, 128
        q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda").to(torch.bfloat16) for _ in range(3))
        dense_ms = bench_ms(lambda: flashext.flash_attention(q, k, v))
        for block_size in ((128, 128), (64, 64)):
            nr, nc = -(-seqlen // block_size[0]), -(-seqlen // block_size[1])
            for density in (0.1, 0.5, 1.0):
                g = torch.Generator().manual_seed(int(density * 100))
                mask = (torch.rand(1, 1, nr, nc, generator=g) < density).cuda()
                # the reference on query rows [0, 256) of (batch 0, head 0): rows are independent
                one = lambda t: t[:1, :256, :1]  # noqa: E731
                out = flashext.block_sparse_attention(q, k, v, mask, block_size)
                sub_mask = mask[..., : -(-256 // block_size[0]), :]
                want = ref.block_sparse_attention(one(q), k[:1, :, :1], v[:1, :, :1], sub_mask, block_size)
                base = ref.block_sparse_attention(one(q), k[:1, :, :1], v[:1, :, :1], sub_mask, block_size,
                                                  compute_dtype=q.dtype)
                verdict = judge("block-sparse", one(out), want, base)
                ms = bench_ms(lambda: flashext.block_sparse_attention(q, k, v, mask, block_size))
                row = {"section": "sparse", "dtype": "bf16", "head_dim": head_dim, "seqlen": seqlen, "batch": batch,
                       "heads": heads, "block_size": list(block_size), "density": density,
                       "measured_density": float(mask.float().mean()),
                       "flashext": {"ms": ms, "valid": verdict.ok, "error": verdict.error},
                       "dense": {"ms": dense_ms}}
                rows.append(row)
                print(f"sparse S={seqlen} blocks {block_size[0]}x{block_size[1]} density {row['measured_density']:.2f}: "
                      f"{ms:.3f} ms, dense {dense_ms:.3f} ms, {dense_ms / ms:.2f}x"
                      f"{'' if verdict.ok else ' (INVALID)'}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


def print_row(row):
    cells = []
    for name, cell in row.items():
        if isinstance(cell, dict):
            if "tflops" in cell:
                cells.append(f"{name} {cell['tflops']:5.0f}" + ("" if cell["valid"] else "(INVALID)"))
            else:
                cells.append(f"{name} n/a")
    print(f"fwd {row['dtype']} D={row['head_dim']:3d} {'causal' if row['causal'] else 'full  '} "
          f"S={row['seqlen']:5d} TFLOP/s: " + "  ".join(cells), flush=True)


def plot(payload, path):
    """The forward grid (fwd rows: fp16 TFLOP/s), else the training grid (train rows: bf16 forward +
    backward TFLOP/s, flashext's backward alone dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    section = "fwd" if any(r["section"] == "fwd" for r in payload["rows"]) else "train"
    dtype, key = ("fp16", "tflops") if section == "fwd" else ("bf16", "fwd_bwd_tflops")
    names = (["flashext", "triton_twin", "sdpa_flash", "sdpa_cudnn", "sdpa_mem_efficient", "flex_attention", "flashext_sm90",
              "flashext_fa2"] if section == "fwd" else ["flashext", "triton_twin", "sdpa_flash", "sdpa_cudnn", "sdpa_default",
                                                        "flashext_fa2"])
    head_dims = sorted({r["head_dim"] for r in payload["rows"] if r["section"] == section})
    fig, axes = plt.subplots(len(head_dims), 2, figsize=(13, 4 * len(head_dims)), squeeze=False, sharey=True)
    for i, head_dim in enumerate(head_dims):
        for j, causal in enumerate((False, True)):
            ax = axes[i][j]
            rows = [r for r in payload["rows"] if r["section"] == section and r["dtype"] == dtype
                    and r["head_dim"] == head_dim and r["causal"] == causal]
            for c, name in enumerate(names):
                points = [(r["seqlen"], r[name][key]) for r in rows if key in r.get(name, {})]
                if points:
                    ax.plot(*zip(*points), marker="o", label=name, color=f"C{c}", linewidth=2.5 if name == "flashext" else 1.2)
            if section == "train":
                points = [(r["seqlen"], r["flashext"]["bwd_tflops"]) for r in rows if "bwd_tflops" in r.get("flashext", {})]
                if points:
                    ax.plot(*zip(*points), marker=".", linestyle="--", color="C0", label="flashext backward alone")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{dtype} D={head_dim} {'causal' if causal else 'non-causal'}")
            ax.set_xlabel("sequence length (B·S = 16384)")
            ax.grid(True, alpha=0.3)
            if j == 0:
                ax.set_ylabel("TFLOP/s" if section == "fwd" else "forward + backward TFLOP/s")
    axes[0][0].legend(fontsize=8)
    what = "forward" if section == "fwd" else "forward + backward"
    fig.suptitle(f"flashext attention {what} on {payload['meta']['gpu']} (torch {payload['meta']['torch']}, "
                 f"commit {payload['meta']['commit'][:10]})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summarize(payload):
    """Ratios flashext / anchor per grid point, then worst and median per anchor."""
    print("\nsummary: flashext TFLOP/s over each anchor's (same inputs, same run)")
    ratios: dict[str, list[float]] = {}
    for row in payload["rows"]:
        if row["section"] != "fwd" or "tflops" not in row.get("flashext", {}):
            continue
        parts = []
        for name, cell in row.items():
            if isinstance(cell, dict) and name != "flashext" and "tflops" in cell:
                ratio = row["flashext"]["tflops"] / cell["tflops"]
                ratios.setdefault(name, []).append(ratio)
                parts.append(f"{ratio:.2f}x {name}")
        print(f"  {row['dtype']} D={row['head_dim']:3d} {'causal' if row['causal'] else 'full  '} S={row['seqlen']:5d} "
              f"{row['flashext']['tflops']:5.0f} TFLOP/s: " + ", ".join(parts))
    for name, values in ratios.items():
        print(f"  vs {name}: worst {min(values):.2f}x, median {statistics.median(values):.2f}x over {len(values)} points")
    for row in payload["rows"]:
        if row["section"] == "sparse":
            print(f"  block-sparse S={row['seqlen']} {row['block_size'][0]}x{row['block_size'][1]} density "
                  f"{row['measured_density']:.2f}: {row['dense']['ms'] / row['flashext']['ms']:.2f}x dense flashext")
    for label in ("fwd_bwd", "bwd"):
        ratios = {}
        for row in payload["rows"]:
            if row["section"] != "train" or f"{label}_tflops" not in row.get("flashext", {}):
                continue
            for name, cell in row.items():
                if isinstance(cell, dict) and name != "flashext" and f"{label}_tflops" in cell:
                    ratios.setdefault(name, []).append(row["flashext"][f"{label}_tflops"] / cell[f"{label}_tflops"])
        for name, values in ratios.items():
            print(f"  {label} vs {name}: worst {min(values):.2f}x, median {statistics.median(values):.2f}x "
                  f"over {len(values)} points")


def main():
    args = parse_args(__doc__, "fwd,train,memory,softmax", "D = 128, S in {1024, 16384}; memory up to 16K", plot, summarize)
    if args is None:
        return
    torch.manual_seed(0)
    payload = {"meta": run_metadata(), "rows": []}
    print(f"{payload['meta']['gpu']}, torch {payload['meta']['torch']}, GPU state {payload['meta']['gpu_state_start']}",
          flush=True)
    sections = set(args.only.split(","))
    # attention.json when the forward grid ran, else one file per section set (attention_train.json)
    name = "attention" if "fwd" in sections else "attention_" + "_".join(sorted(sections))
    runs = {"fwd": section_fwd, "train": section_train, "memory": section_memory, "softmax": section_softmax,
            "sparse": section_sparse}
    if sections - runs.keys():
        raise SystemExit(f"bench_attention: unknown sections {sorted(sections - runs.keys())}; choose from {list(runs)}")
    for section, run in runs.items():
        if section in sections:
            run(payload["rows"], args.quick)
            path = write_json(f"{name}.json", payload)  # after each section: a later fault loses only its own
    if any(r["section"] in ("fwd", "train") for r in payload["rows"]):
        plot(payload, output_dir() / f"{name}.png")
    print(f"wrote {path}")
    summarize(payload)


if __name__ == "__main__":
    main()
