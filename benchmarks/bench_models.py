"""A Llama-3.2-1B-shaped Hugging Face model on attn_implementation="flashext" against "sdpa" and
"eager", same process, same weights, same inputs (random weights, nothing downloaded).

    python benchmarks/bench_models.py [--quick] [--only padded,unpadded,generate]

Model: LlamaForCausalLM, 16 layers, width 2048, MLP 8192, 32 query / 8 KV heads (D = 64), vocab
128256, bf16, on one GPU.
padded    batch 8 × 2048, random lengths (about half the tokens padding, right-padded): forward
          (logits, no grad) and a training step (forward, cross-entropy on the real tokens,
          backward), no cache: "flashext" (varlen: no attention work on padding),
          "flashext_padding_free" (apply_flashext(padding_free=True): the real tokens packed
          before the first layer, so no layer works on padding) against "sdpa" (a 4-D mask,
          computing on the padding) and, forward only, "eager". Logits on the real tokens are
          compared first.
unpadded  the same without padding: "flashext", "sdpa", "eager", and "direct" (an attention
          function that only transposes and calls flashext.flash_attention, causal): what the
          integration costs over calling flashext itself.
generate  greedy generate() of 128 new tokens after a 512-token prompt, batch 1 and 16, tokens/s:
          "flashext" against "sdpa" (and whether their tokens agree).
Rounds in a balanced order, median round (benchmarks.common). Writes models.json to $OUT (or
benchmarks/results).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import flashext  # noqa: E402
from benchmarks.common import bench_rounds, parse_args, run_metadata, write_json  # noqa: E402

VOCAB, WIDTH, MLP, LAYERS, HEADS, HEADS_KV = 128256, 2048, 8192, 16, 32, 8


def direct_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The least an attention function can do with flashext: (B, H, S, D) views in, causal."""
    out = flashext.flash_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=True,
                                   softmax_scale=scaling)
    return out, None


def register_direct():
    from transformers import AttentionInterface

    AttentionInterface.register("direct", direct_attention)
    try:
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
        AttentionMaskInterface.register("direct", flash_attention_mask)
    except ImportError:
        pass


def build(implementations, layers: int):
    """One model per attention implementation, the same random bf16 weights in each (same seed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    models = {}
    for name in implementations:  # a config each: set_attn_implementation writes into the config
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=MLP, num_hidden_layers=layers,
                             num_attention_heads=HEADS, num_key_value_heads=HEADS_KV, max_position_embeddings=8192,
                             tie_word_embeddings=True, rope_theta=500000.0)
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = LlamaForCausalLM(config).to(torch.bfloat16)
        if name == "flashext_padding_free":
            from flashext.integrations.transformers import apply_flashext

            apply_flashext(model, bias_gelu=False, padding_free=True)
        else:
            model.set_attn_implementation(name)
        models[name] = model
    for name, model in models.items():
        want = "flashext" if name == "flashext_padding_free" else name
        assert model.config._attn_implementation == want, (name, model.config._attn_implementation)
    return models


def inputs(batch: int, seqlen: int, padded: bool):
    g = torch.Generator().manual_seed(seqlen)
    ids = torch.randint(0, VOCAB, (batch, seqlen), generator=g).cuda()
    if not padded:
        return ids, None
    lengths = torch.randint(1, seqlen + 1, (batch,), generator=g)
    mask = (torch.arange(seqlen)[None, :] < lengths[:, None]).long().cuda()  # right padding
    return ids, mask


def train_step(model, ids, mask):
    labels = ids if mask is None else ids.masked_fill(mask == 0, -100)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return loss


def logits_gap(models, ids, mask):
    """Largest |logit| difference on real tokens of each model against "sdpa"."""
    with torch.no_grad():
        want = models["sdpa"](input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        gaps = {}
        for name, model in models.items():
            if name != "sdpa":
                got = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
                gaps[name] = float((got - want)[real].abs().max())
                del got
        return gaps


def section_dense(rows, quick: bool, padded: bool):
    batch, seqlen, layers = (2, 1024, 4) if quick else (8, 2048, LAYERS)
    names = ["flashext"] + (["flashext_padding_free"] if padded else []) + ["sdpa", "eager"] + (
        [] if padded else ["direct"])
    models = build(names, layers)
    ids, mask = inputs(batch, seqlen, padded)
    section = "padded" if padded else "unpadded"
    row = {"section": section, "batch": batch, "seqlen": seqlen, "layers": layers,
           "real_tokens": int(ids.numel() if mask is None else mask.sum()), "logit_gap_vs_sdpa": logits_gap(models, ids, mask)}

    def forward(model):
        def run():
            with torch.no_grad():
                return model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        return run

    fwd = bench_rounds({name: forward(m) for name, m in models.items()}, warmup=1, rep=3)
    train_names = [n for n in names if n != "eager"]
    train = bench_rounds({name: (lambda m=models[name]: train_step(m, ids, mask)) for name in train_names},
                         warmup=1, rep=3)
    for name in names:
        row[name] = {"forward_ms": fwd[name][0], "forward_rounds_ms": fwd[name][1]}
        if name in train:
            row[name].update({"train_ms": train[name][0], "train_rounds_ms": train[name][1]})
    rows.append(row)
    print(f"{section} {batch}x{seqlen} ({row['real_tokens']} real tokens) ms: " +
          "  ".join(f"{n} fwd {row[n]['forward_ms']:.1f}" + (f" train {row[n]['train_ms']:.1f}" if "train_ms" in row[n]
                                                            else "") for n in names) +
          f"; logit gaps vs sdpa {row['logit_gap_vs_sdpa']}", flush=True)
    del models
    torch.cuda.empty_cache()


def section_generate(rows, quick: bool):
    prompt, new = (128, 32) if quick else (512, 128)
    models = build(["flashext", "sdpa"], 4 if quick else LAYERS)
    for batch in (1, 16):
        ids = inputs(batch, prompt, False)[0]
        row = {"section": "generate", "batch": batch, "prompt": prompt, "new_tokens": new}
        tokens = {}
        for name, model in models.items():
            model.generation_config.pad_token_id = 0
            run = lambda m=model: m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,  # noqa: E731
                                             min_new_tokens=new, do_sample=False)
            run()
            times = []
            for _ in range(3):
                torch.cuda.synchronize()
                start = time.perf_counter()
                tokens[name] = run()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            seconds = sorted(times)[1]
            row[name] = {"seconds": seconds, "tokens_per_s": batch * new / seconds}
        row["same_tokens"] = bool(torch.equal(tokens["flashext"], tokens["sdpa"]))
        row["first_difference"] = (None if row["same_tokens"] else
                                   int((tokens["flashext"] != tokens["sdpa"]).any(0).nonzero()[0]) - prompt)
        rows.append(row)
        print(f"generate batch {batch}: tokens/s flashext {row['flashext']['tokens_per_s']:.0f}  "
              f"sdpa {row['sdpa']['tokens_per_s']:.0f}; same tokens: {row['same_tokens']}", flush=True)
    del models
    torch.cuda.empty_cache()


def plot(payload, path):  # a table is what this benchmark has to say: no plot
    del payload, path


def summarize(payload):
    print("\nsummary: time(anchor) / time(flashext), same inputs, same run")
    for row in payload["rows"]:
        if row["section"] == "generate":
            ratio = row["flashext"]["tokens_per_s"] / row["sdpa"]["tokens_per_s"]
            print(f"  generate batch {row['batch']}: {ratio:.2f}x sdpa tokens/s, same tokens {row['same_tokens']}")
            continue
        for what in ("forward", "train"):
            for ours in ("flashext", "flashext_padding_free"):
                if f"{what}_ms" not in row.get(ours, {}):
                    continue
                parts = [f"{row[n][f'{what}_ms'] / row[ours][f'{what}_ms']:.2f}x {n}"
                         for n in ("sdpa", "eager", "direct") if f"{what}_ms" in row.get(n, {})]
                print(f"  {row['section']} {what}, {ours}: " + ", ".join(parts))


def main():
    args = parse_args(__doc__, "padded,unpadded,generate", "batch 2 x 1024, 4 layers; short generate", plot, summarize)
    if args is None:
        return
    if not torch.cuda.is_available():
        raise SystemExit("bench_models needs a CUDA GPU")
    import flashext.integrations.transformers  # noqa: F401  (registers "flashext")

    register_direct()
    payload = {"meta": run_metadata(), "rows": []}
    print(f"{payload['meta']['gpu']}, torch {payload['meta']['torch']}", flush=True)
    sections = set(args.only.split(","))
    if "padded" in sections:
        section_dense(payload["rows"], args.quick, padded=True)
    if "unpadded" in sections:
        section_dense(payload["rows"], args.quick, padded=False)
    if "generate" in sections:
        section_generate(payload["rows"], args.quick)
    path = write_json("models.json", payload)
    print(f"wrote {path}")
    summarize(payload)


if __name__ == "__main__":
    main()
