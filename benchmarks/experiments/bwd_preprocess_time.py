"""Times the backward's preprocess (D = rowsum(dO ∘ O), lse · log2 e, dq_accum zeroed) beside
FlashAttention-2's (SDPA flash's flash_bwd_dot_do_o_kernel) at B · S = 16384 for D = 64 and 128,
and at the training example's 8 × 8 heads × 1024 rows: the CUDA time per launch under
torch.profiler, five backward calls each after three warm-ups (bf16).

    python benchmarks/experiments/bwd_preprocess_time.py
"""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flashext

SHAPES = ((4, 4096, 32, 64), (4, 4096, 16, 128), (8, 1024, 8, 64))  # (batch, seqlen, heads, head_dim)


def backward_both(q, k, v, dout, q_t, k_t, v_t):
    flashext.flash_attention(q, k, v).backward(dout)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        F.scaled_dot_product_attention(q_t, k_t, v_t).backward(dout.transpose(1, 2))


def main() -> None:
    for batch, seqlen, heads, head_dim in SHAPES:
        q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn_like(q)
        q_t, k_t, v_t = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        for _ in range(3):
            backward_both(q, k, v, dout, q_t, k_t, v_t)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
            for _ in range(5):
                backward_both(q, k, v, dout, q_t, k_t, v_t)
            torch.cuda.synchronize()
        for event in prof.key_averages():
            if "preprocess" in event.key or "dot_do_o" in event.key:
                print(f"B={batch} S={seqlen} H={heads} D={head_dim}: {event.key[:60]} {event.device_time:.1f} us "
                      f"x{event.count}")


if __name__ == "__main__":
    main()
