"""Generate with a small GPT from a paged KV cache: prefill by flash_attention_varlen, decode by
flash_attention_with_kvcache, each decode step one CUDA-graph replay; against the same model's
loop on F.scaled_dot_product_attention with a dense (static, masked) cache, run eagerly (sdpa) and
with each step one CUDA-graph replay too (sdpa_graph: the host's share taken out). Greedy
decoding: both must produce the same tokens, up to ties: where a sequence's tokens first differ,
both loops had the same inputs, so the token flashext chose must be within rounding of SDPA's best
there; the example reports SDPA's logit gap between the two tokens at each first divergence,
against the top-two gaps of all steps.

    python -m flashext.examples.serve_gpt [--batch 32] [--prompt 512] [--new 128] [--out DIR]

Weights are generated (seeded; nothing downloaded): 4 pre-norm blocks, width 512, 8 query heads on
2 KV heads (GQA 4, D = 64), MLP 512 → 2048 → 512 with bias + GeLU, bf16. Prompts have random
lengths up to --prompt; pages of 16 tokens, shuffled, so no sequence's pages are contiguous.
Prints tokens/s of the decode loops (timed with nothing but the decoding inside them; the top-two
logit gaps are computed after the timing) and, with --out, writes serve_gpt_batch<B>.json there.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import flashext
from flashext.examples import git_commit

VOCAB, WIDTH, HEADS, HEADS_KV, LAYERS = 512, 512, 8, 2, 4
HEAD_DIM = WIDTH // HEADS
PAGE = 16


def make_weights(seed: int) -> dict:
    g = torch.Generator(device="cpu").manual_seed(seed)
    rnd = lambda *shape, scale=0.02: (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).cuda()  # noqa: E731
    w = {"embed": rnd(VOCAB, WIDTH, scale=1.0), "head": rnd(VOCAB, WIDTH), "layers": []}
    for _ in range(LAYERS):
        w["layers"].append({
            "qkv": rnd((HEADS + 2 * HEADS_KV) * HEAD_DIM, WIDTH, scale=WIDTH**-0.5),
            "proj": rnd(WIDTH, WIDTH, scale=WIDTH**-0.5),
            "up": rnd(4 * WIDTH, WIDTH, scale=WIDTH**-0.5), "up_bias": rnd(4 * WIDTH),
            "down": rnd(WIDTH, 4 * WIDTH, scale=(4 * WIDTH)**-0.5),
        })
    return w


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding on (..., S, heads, D) at integer positions (..., S)."""
    half = HEAD_DIM // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, device=x.device) / half)
    angle = positions[..., None].float() * freq  # (..., S, half)
    cos, sin = angle.cos()[..., None, :], angle.sin()[..., None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


def block(layer, x, positions, attend, use_flashext: bool):
    """One pre-norm block on x (..., S, WIDTH); attend(q, k, v) does the attention (and caching)."""
    h = F.layer_norm(x, (WIDTH,))
    q, k, v = (h @ layer["qkv"].T).split([HEADS * HEAD_DIM, HEADS_KV * HEAD_DIM, HEADS_KV * HEAD_DIM], dim=-1)
    q = rope(q.unflatten(-1, (HEADS, HEAD_DIM)), positions)
    k = rope(k.unflatten(-1, (HEADS_KV, HEAD_DIM)), positions)
    v = v.unflatten(-1, (HEADS_KV, HEAD_DIM))
    x = x + attend(q, k, v).flatten(-2) @ layer["proj"].T
    h = F.layer_norm(x, (WIDTH,)) @ layer["up"].T
    h = flashext.bias_gelu(h, layer["up_bias"]) if use_flashext else F.gelu(h + layer["up_bias"])
    return x + h @ layer["down"].T


class FlashextServer:
    """Paged caches (one per layer), prefill by varlen attention, decode by the KV-cache kernel."""

    def __init__(self, weights, batch: int, capacity: int, generator):
        self.w, self.batch = weights, batch
        pages_per_seq = -(-capacity // PAGE)
        shape = (batch * pages_per_seq, PAGE, HEADS_KV, HEAD_DIM)
        self.k_cache = [torch.zeros(shape, dtype=torch.bfloat16, device="cuda") for _ in range(LAYERS)]
        self.v_cache = [torch.zeros(shape, dtype=torch.bfloat16, device="cuda") for _ in range(LAYERS)]
        self.table = torch.randperm(batch * pages_per_seq, generator=generator).view(batch, pages_per_seq).int().cuda()
        self.lengths = torch.zeros(batch, dtype=torch.int32, device="cuda")

    def prefill(self, prompts: list[torch.Tensor]) -> torch.Tensor:
        """Packed prompts through every layer; their K, V written into the pages; last logits."""
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int32, device="cuda")
        cu = torch.zeros(self.batch + 1, dtype=torch.int32, device="cuda")
        cu[1:] = lengths.cumsum(0)
        tokens = torch.cat(prompts)
        positions = torch.cat([torch.arange(len(p), device="cuda") for p in prompts])
        x = self.w["embed"][tokens]
        zero = torch.zeros(self.batch, dtype=torch.int32, device="cuda")
        longest = int(lengths.max())
        rows = torch.repeat_interleave(torch.arange(self.batch, device="cuda"), lengths.long())  # packed row's sequence
        for i, layer in enumerate(self.w["layers"]):
            def attend(q, k, v, i=i):
                # the prompt's keys into this layer's pages: an append at length 0, no queries
                padded_k = torch.zeros(self.batch, longest, HEADS_KV, HEAD_DIM, dtype=k.dtype, device="cuda")
                padded_v = torch.zeros_like(padded_k)
                padded_k[rows, positions] = k
                padded_v[rows, positions] = v
                flashext.flash_attention_with_kvcache(q[:0].view(self.batch, 0, HEADS, HEAD_DIM), self.k_cache[i],
                                                      self.v_cache[i], zero, padded_k, padded_v,
                                                      block_table=self.table)
                return flashext.flash_attention_varlen(q, k, v, cu, cu, longest, longest, causal=True)
            x = block(layer, x, positions, attend, True)
        self.lengths.copy_(lengths)
        last = x[cu[1:].long() - 1]
        return F.layer_norm(last, (WIDTH,)) @ self.w["head"].T

    def decode_step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One token per sequence at position lengths[b]; appends to the caches; returns logits."""
        x = self.w["embed"][tokens][:, None]  # (B, 1, WIDTH)
        positions = self.lengths[:, None]
        for i, layer in enumerate(self.w["layers"]):
            def attend(q, k, v, i=i):
                return flashext.flash_attention_with_kvcache(q, self.k_cache[i], self.v_cache[i], self.lengths, k, v,
                                                             block_table=self.table, causal=True)
            x = block(layer, x, positions, attend, True)
        self.lengths.add_(1)
        return (F.layer_norm(x[:, 0], (WIDTH,)) @ self.w["head"].T)


class SdpaServer:
    """The same model on F.scaled_dot_product_attention with dense (B, H, S, D) caches, masked to
    each sequence's length (a static cache, as Hugging Face's): its decode step keeps the lengths on
    the device, so it can be captured in a CUDA graph too."""

    def __init__(self, weights, batch: int, capacity: int):
        self.w, self.batch, self.capacity = weights, batch, capacity
        shape = (batch, HEADS_KV, capacity, HEAD_DIM)
        self.k = [torch.zeros(shape, dtype=torch.bfloat16, device="cuda") for _ in range(LAYERS)]
        self.v = [torch.zeros(shape, dtype=torch.bfloat16, device="cuda") for _ in range(LAYERS)]
        self.lengths = torch.zeros(batch, dtype=torch.long, device="cuda")
        self.keys = torch.arange(capacity, device="cuda")
        self.rows = torch.arange(batch, device="cuda")

    def prefill(self, prompts):
        logits = []
        self.lengths.copy_(torch.tensor([len(p) for p in prompts]))
        for b, prompt in enumerate(prompts):
            x = self.w["embed"][prompt][None]
            positions = torch.arange(len(prompt), device="cuda")[None]
            for i, layer in enumerate(self.w["layers"]):
                def attend(q, k, v, i=i, b=b):
                    self.k[i][b, :, : k.shape[1]] = k[0].transpose(0, 1)
                    self.v[i][b, :, : v.shape[1]] = v[0].transpose(0, 1)
                    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                         is_causal=True, enable_gqa=True)
                    return out.transpose(1, 2)
                x = block(layer, x, positions, attend, False)
            logits.append(F.layer_norm(x[0, -1], (WIDTH,)) @ self.w["head"].T)
        return torch.stack(logits)

    def decode_step(self, tokens):
        lengths = self.lengths
        x = self.w["embed"][tokens][:, None]
        visible = self.keys[None, :] <= lengths[:, None]  # the new token sees its cache and itself
        for i, layer in enumerate(self.w["layers"]):
            def attend(q, k, v, i=i):
                self.k[i][self.rows, :, lengths] = k[:, 0]
                self.v[i][self.rows, :, lengths] = v[:, 0]
                out = F.scaled_dot_product_attention(q.transpose(1, 2), self.k[i], self.v[i],
                                                     attn_mask=visible[:, None, None, :], enable_gqa=True)
                return out.transpose(1, 2)
            x = block(layer, x, lengths[:, None], attend, False)
        self.lengths.add_(1)
        return F.layer_norm(x[:, 0], (WIDTH,)) @ self.w["head"].T


def captured_step(server, first_logits: torch.Tensor):
    """server.decode_step captured once as a CUDA graph (its lengths live on the device), as a
    function of the step's tokens that replays it: warmed up outside the capture (the token it
    appends, the first replay overwrites at the same position), the length bumps of the warm-up and
    the capture undone."""
    static_tokens = first_logits.argmax(-1).int()
    lengths_before = server.lengths.clone()
    server.decode_step(static_tokens)
    server.lengths.copy_(lengths_before)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_logits = server.decode_step(static_tokens)
    server.lengths.copy_(lengths_before)

    def step(tokens: torch.Tensor) -> torch.Tensor:
        static_tokens.copy_(tokens)
        graph.replay()
        return static_logits
    return step


def generate(first_logits: torch.Tensor, step, args, kept_logits: list | None = None):
    """Greedy tokens from the prefill's logits through args.new - 1 decode steps, and the steps'
    tokens per second (the GPU idle at the start and drained at the end); each step's logits
    appended to kept_logits when given."""
    tokens = [first_logits.argmax(-1).int()]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.new - 1):
        logits = step(tokens[-1])
        tokens.append(logits.argmax(-1).int())
        if kept_logits is not None:
            kept_logits.append(logits)
    torch.cuda.synchronize()
    return tokens, args.batch * (args.new - 1) / (time.perf_counter() - start)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=512, help="longest prompt (lengths are random)")
    parser.add_argument("--new", type=int, default=128, help="tokens generated per sequence")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="where serve_gpt_batch<B>.json goes (default: not written)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("serve_gpt needs a CUDA GPU")
    g = torch.Generator().manual_seed(args.seed)
    weights = make_weights(args.seed)
    lengths = torch.randint(1, args.prompt + 1, (args.batch,), generator=g)
    prompts = [torch.randint(0, VOCAB, (int(n),), generator=g).cuda() for n in lengths]
    capacity = args.prompt + args.new
    results = {}
    with torch.inference_mode():
        ours, sdpa = FlashextServer(weights, args.batch, capacity, g), SdpaServer(weights, args.batch, capacity)
        first_ours, first_sdpa = ours.prefill(prompts), sdpa.prefill(prompts)
        generated = {}
        sdpa_logits = []  # each step's logits kept: their top-two gaps are read after the timing
        generated["flashext"], results["flashext"] = generate(first_ours, captured_step(ours, first_ours), args)
        generated["sdpa"], results["sdpa"] = generate(first_sdpa, sdpa.decode_step, args, sdpa_logits)
        # The SDPA loop once more with each step one CUDA-graph replay, as ours: the host's part of
        # the comparison taken out (a fresh server and prefill, the same capture as ours).
        sdpa_g = SdpaServer(weights, args.batch, capacity)
        first_g = sdpa_g.prefill(prompts)
        generated["sdpa_graph"], results["sdpa_graph"] = generate(first_g, captured_step(sdpa_g, first_g), args)
    step_logits = [first_sdpa.float()] + [logits.float() for logits in sdpa_logits]  # step t made token t
    gaps = torch.cat([(top2[:, 0] - top2[:, 1]) for top2 in (logits.topk(2, dim=-1).values for logits in step_logits)])
    ours_tokens, sdpa_tokens = torch.stack(generated["flashext"], 1), torch.stack(generated["sdpa"], 1)
    same = (ours_tokens == sdpa_tokens).all(1)
    # At a sequence's first divergence t both loops had the same tokens before: SDPA's logit gap
    # between its token and flashext's there says whether flashext's pick was a near-tie.
    divergence_gaps = []
    for b in (~same).nonzero().flatten().tolist():
        t = int((ours_tokens[b] != sdpa_tokens[b]).nonzero()[0])
        logits = step_logits[t][b]
        divergence_gaps.append(float(logits[sdpa_tokens[b, t]] - logits[ours_tokens[b, t]]))
    print(f"batch {args.batch}, prompts up to {args.prompt}, {args.new} new tokens on {torch.cuda.get_device_name()}:")
    for name, tps in results.items():
        print(f"  {name:9} {tps:9.0f} tokens/s")
    print(f"  flashext / sdpa: {results['flashext'] / results['sdpa']:.2f}x, "
          f"flashext / sdpa_graph: {results['flashext'] / results['sdpa_graph']:.2f}x")
    graph_same = int((torch.stack(generated["sdpa_graph"], 1) == sdpa_tokens).all(1).sum())
    print(f"  sdpa_graph's greedy tokens equal sdpa's in {graph_same} of {args.batch} sequences")
    print(f"  identical greedy tokens: {int(same.sum())} of {args.batch} sequences")
    largest = max(divergence_gaps, default=0.0)
    share = float((gaps <= largest).float().mean())  # of all steps' top-two gaps, the share at most that
    if divergence_gaps:
        print(f"  at the first divergences, SDPA's logit gap between its token and flashext's: at most "
              f"{largest:.4f} (the top-two gap of all steps is that small at {100 * share:.1f} % of them; "
              f"median {float(gaps.median()):.4f})")
    summary = {"tokens_per_s": results, "identical": int(same.sum()), "batch": args.batch, "prompt": args.prompt,
               "new": args.new, "sdpa_graph_identical_to_sdpa": graph_same, "divergence_gaps": divergence_gaps,
               "top2_gap_median": float(gaps.median()),
               "share_of_steps_within_largest_divergence_gap": share, "gpu": torch.cuda.get_device_name(),
               "torch": torch.__version__, "commit": git_commit()}
    if args.out is not None:
        path = Path(args.out) / f"serve_gpt_batch{args.batch}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"  wrote {path}")
    return summary


if __name__ == "__main__":
    main()
