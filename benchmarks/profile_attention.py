"""One launch of each forward (or backward) on a few grid shapes, for Nsight Compute to read side
by side.

    ncu --clock-control none -k regex:flash_fwd --section ... python benchmarks/profile_attention.py
    FLASHEXT_PROFILE_BWD=1 ncu -k regex:"flash_bwd_kernel|flash_bwd_dq_dk_dv" ... (the backward)

Runs flashext.flash_attention and SDPA's flash backend (FlashAttention-2) once per shape, on the
benchmark grid's shapes (B · S = 16384 tokens, H = 2048 / D), so each pair of profiled kernels
in the report did the same work; FLASHEXT_PROFILE_CUDNN=1 adds SDPA's cuDNN backend (the Hopper
forward's anchor; scripts/gpu.sh then matches its kernels too). Shapes:
FLASHEXT_PROFILE_SHAPES="dtype:D:causal:S,..." (default: the grid's weakest points).
FLASHEXT_PROFILE_DECODE=1 profiles decode instead (bench_decode.py's shapes: one query token, GQA
32/8, D = 128, batch × KV length FLASHEXT_PROFILE_SHAPES="B:S,...", default 1:32768,64:8192):
flash_attention_with_kvcache (the split kernel and its combine) beside SDPA's cuDNN backend.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import flashext  # noqa: E402

DEFAULT = "bf16:64:1:512,bf16:64:1:2048,bf16:128:0:512,bf16:256:0:2048,bf16:256:1:1024,bf16:128:0:16384"
DEFAULT_BWD = "bf16:64:0:4096,bf16:128:0:4096,bf16:128:1:4096,bf16:256:0:4096"


def decode(shapes: str) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for spec in shapes.split(","):
        batch, seqlen = (int(x) for x in spec.split(":"))
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(batch, seqlen, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(2))
        lens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
        print(f"decode bf16 {batch} x {seqlen}: flashext, then sdpa_cudnn", flush=True)
        flashext.flash_attention_with_kvcache(q, k, v, lens)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
        torch.cuda.synchronize()


def main():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if os.environ.get("FLASHEXT_PROFILE_DECODE") == "1":
        return decode(os.environ.get("FLASHEXT_PROFILE_SHAPES", "1:32768,64:8192"))

    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
    backward = os.environ.get("FLASHEXT_PROFILE_BWD") == "1"
    cudnn = os.environ.get("FLASHEXT_PROFILE_CUDNN") == "1"
    for spec in os.environ.get("FLASHEXT_PROFILE_SHAPES", DEFAULT_BWD if backward else DEFAULT).split(","):
        dname, head_dim, causal, seqlen = spec.split(":")
        head_dim, causal, seqlen = int(head_dim), causal == "1", int(seqlen)
        batch, heads = 16384 // seqlen, 2048 // head_dim
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtypes[dname], generator=gen)
                   for _ in range(3))
        backends = [SDPBackend.FLASH_ATTENTION] + ([SDPBackend.CUDNN_ATTENTION] if cudnn else [])
        print(f"shape {dname} D={head_dim} {'causal' if causal else 'full'} S={seqlen}: flashext, then "
              + ", ".join(b.name.lower() for b in backends), flush=True)
        if backward:
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            dout = torch.randn_like(q)
        out = flashext.flash_attention(q, k, v, causal=causal)
        if backward:
            out.backward(dout)
        for backend in backends:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     is_causal=causal)
                if backward:
                    out.backward(dout.transpose(1, 2))
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
