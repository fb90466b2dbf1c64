"""A Llama-style Hugging Face model on flashext attention beside "sdpa": a padded batch, greedy
generate() and a few training steps, from one config and random weights (nothing downloaded).

    python examples/hf_llama.py [--layers 8] [--batch 8] [--seqlen 1024]

Prints the largest logit difference of "flashext" against "sdpa" (and both against fp32
"eager" on the same bf16 weights), whether greedy generation gives the same tokens, the training
losses side by side, and the time of each.
"""

from __future__ import annotations

import argparse
import time

import torch

import flashext.integrations.transformers  # noqa: F401  (registers attn_implementation="flashext")


def build(implementation: str, args, dtype=torch.bfloat16):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=args.width, intermediate_size=4 * args.width,
                         num_hidden_layers=args.layers, num_attention_heads=args.width // 64,
                         num_key_value_heads=max(1, args.width // 256), max_position_embeddings=4 * args.seqlen)
    model = LlamaForCausalLM(config).to(dtype).cuda()
    model.set_attn_implementation(implementation)
    return model


def timed(fn, repeats: int = 3):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        result = fn()
    torch.cuda.synchronize()
    return result, (time.perf_counter() - start) / repeats * 1e3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("hf_llama needs a CUDA GPU")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 32000, (args.batch, args.seqlen), generator=g).cuda()
    lengths = torch.randint(args.seqlen // 4, args.seqlen + 1, (args.batch,), generator=g)
    mask = (torch.arange(args.seqlen)[None, :] >= (args.seqlen - lengths)[:, None]).long().cuda()  # left padding
    real = mask.bool()
    models = {name: build(name, args) for name in ("flashext", "sdpa")}
    models["eager_fp32"] = build("eager", args, torch.float32)
    logits, times = {}, {}
    with torch.no_grad():
        for name, model in models.items():
            out, times[name] = timed(lambda model=model: model(ids, attention_mask=mask).logits)
            logits[name] = out[real].float()
    print(f"forward of a left-padded batch {args.batch} x {args.seqlen} ({int(lengths.sum())} real tokens):")
    for name in ("flashext", "sdpa"):
        print(f"  {name:10} {times[name]:8.1f} ms, largest |logit - fp32 eager| "
              f"{(logits[name] - logits['eager_fp32']).abs().max().item():.4f}")
    print(f"  flashext vs sdpa: largest difference {(logits['flashext'] - logits['sdpa']).abs().max().item():.4f}, "
          f"{times['sdpa'] / times['flashext']:.2f}x faster")
    del models["eager_fp32"]
    prompt, prompt_mask = ids[:, -64:], mask[:, -64:].clone()
    prompt_mask[:, -1] = 1
    tokens = {}
    with torch.no_grad():
        for name, model in models.items():
            tokens[name], times[name] = timed(lambda model=model: model.generate(
                prompt, attention_mask=prompt_mask, max_new_tokens=32, do_sample=False, pad_token_id=0), repeats=1)
    same = (tokens["flashext"] == tokens["sdpa"]).all(dim=1)
    print(f"greedy generate, 32 tokens: identical in {int(same.sum())} of {args.batch} sequences; "
          f"flashext {times['flashext']:.0f} ms, sdpa {times['sdpa']:.0f} ms")
    for name, model in models.items():
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        losses = []
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = model(ids, attention_mask=mask, labels=ids.masked_fill(~real, -100)).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
        torch.cuda.synchronize()
        print(f"training {name:9}: losses {' '.join(f'{x:.4f}' for x in losses)}, "
              f"{(time.perf_counter() - start) / args.steps * 1e3:.0f} ms/step")


if __name__ == "__main__":
    main()
