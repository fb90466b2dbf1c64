"""attn_implementation="flashext" with flashext's CUDA kernels, against "sdpa" and an fp32 "eager"
model with the same (16-bit-rounded) weights, for every family of tests/hf_families.py in fp16 and
bf16: logits (unpadded, left- and right-padded batches) within 2 × sdpa's error against fp32
eager; packed sequences against separate runs; greedy generate() for 32 tokens (the same tokens
as "sdpa", or a divergence only where the top two logits are within that error, reported); a
training step's loss and gradients within the backward's rule (3 ×); generate() with a static
cache under torch.compile.

Gemma 2 soft-caps its attention scores, which transformers' "sdpa" ignores: its baseline is
"eager" in the same dtype (plain PyTorch doing the same computation, the rule of DESIGN.md)."""

from __future__ import annotations

import pytest
import torch

from flashext.testing import GRADIENT_FACTOR, assert_close, judge
from tests.helpers import HALF_DTYPES, HALF_IDS, requires_cuda

transformers = pytest.importorskip("transformers")

import flashext.integrations.transformers  # noqa: E402,F401  (registers "flashext")
from tests.hf_families import FAMILIES, VOCAB, family_model  # noqa: E402

pytestmark = requires_cuda
DEVICE = "cuda"
PACKED_FAMILIES = ["llama", "mistral", "qwen2", "gemma2", "gemma3"]  # they pass position_ids to attention


def baseline_implementation(family: str) -> str:
    return "eager" if family == "gemma2" else "sdpa"


def models(family: str, dtype, train: bool = False):
    """flashext, the baseline and the fp32 truth: eager on the 16-bit model's weights in fp32."""
    made = {name: family_model(family, name, dtype, DEVICE) for name in ("flashext", baseline_implementation(family))}
    truth = family_model(family, "eager", dtype, DEVICE).float()
    made["truth"] = truth
    for model in made.values():
        model.train(train)
    return made


def padded_batch(side: str, seqlen: int = 37, lengths=(37, 25, 11)):
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (len(lengths), seqlen), generator=generator)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        if side == "left":
            mask[row, seqlen - length:] = 1
        else:
            mask[row, :length] = 1
    if side == "none":
        mask[:] = 1
    return ids.to(DEVICE), mask.to(DEVICE)


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
@pytest.mark.parametrize("side", ["none", "left", "right"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits(family, side, dtype):
    made = models(family, dtype)
    ids, mask = padded_batch(side)
    with torch.no_grad():
        logits = {name: model(ids, attention_mask=mask).logits.float() for name, model in made.items()}
    real = mask.bool()
    base = baseline_implementation(family)
    assert_close(f"{family} {side} logits vs fp32 eager ({base} as the baseline)", logits["flashext"][real],
                 logits["truth"][real], logits[base][real])


@pytest.mark.parametrize("family", PACKED_FAMILIES)
def test_packed_sequences(family):
    made = models(family, torch.bfloat16)
    lengths = [13, 5, 19]
    generator = torch.Generator().manual_seed(4)
    ids = torch.randint(1, VOCAB, (1, sum(lengths)), generator=generator).to(DEVICE)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None].to(DEVICE)
    base = baseline_implementation(family)
    with torch.no_grad():
        packed = made["flashext"](ids, position_ids=position_ids).logits[0].float()
        alone = {name: torch.cat([made[name](part).logits[0].float() for part in ids.split(lengths, dim=1)])
                 for name in ("truth", base)}
    assert_close(f"{family} packed vs separate fp32 eager runs", packed, alone["truth"], alone[base])


def greedy(model, ids, mask, new_tokens: int, **kwargs):
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_logits=True, **kwargs)
    return out.sequences, torch.stack(out.logits, dim=1).float()  # (B, P + N), (B, N, V)


def check_greedy_agrees(label, ours, theirs, truth_model, ids, mask) -> list[str]:
    """Tokens of two greedy runs, each (sequences, logits): the same, or at the first step where a
    row diverges, the two picked tokens' fp32 logits (truth_model on the common prefix) differ by
    no more than 2 × the second run's logit error there (+ 1e-5). Returns the divergences found."""
    prompt = ids.shape[1]
    reports = []
    for row in range(ids.shape[0]):
        differ = (ours[0][row, prompt:] != theirs[0][row, prompt:]).nonzero()
        if differ.numel() == 0:
            continue
        step = int(differ[0])
        prefix = theirs[0][row, : prompt + step][None]
        prefix_mask = torch.cat([mask[row], torch.ones(step, dtype=mask.dtype, device=mask.device)])[None]
        positions = (prefix_mask.cumsum(-1) - 1).clamp(min=0)  # as generate() numbers a left-padded row
        with torch.no_grad():
            truth = truth_model(prefix, attention_mask=prefix_mask, position_ids=positions).logits[0, -1].float()
        a, b = int(ours[0][row, prompt + step]), int(theirs[0][row, prompt + step])
        margin = abs(float(truth[a] - truth[b]))
        error = float((theirs[1][row, step] - truth).abs().max())
        reports.append(f"{label} row {row}: diverges at new token {step} ({a} vs {b}); fp32 logits differ by "
                       f"{margin:.2e}, the baseline's logit error there {error:.2e}")
        assert margin <= 2 * error + 1e-5, reports[-1]
    return reports


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_generate_32_tokens(family, dtype):
    made = models(family, dtype)
    ids, mask = padded_batch("left", seqlen=17, lengths=(17, 9, 4))
    base = baseline_implementation(family)
    ours, theirs = (greedy(made[name], ids, mask, 32) for name in ("flashext", base))
    for line in check_greedy_agrees(f"{family} generate", ours, theirs, made["truth"], ids, mask):
        print(line)


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_training_step(family, dtype):
    """One step on a right-padded batch: the per-token losses (within 2 × the baseline's error; a
    single mean would compare one rounding with another) and every parameter's gradient of their
    mean (within 3 ×) against the fp32 model's."""
    made = models(family, dtype, train=True)
    ids, mask = padded_batch("right")
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100).reshape(-1)
    losses, grads = {}, {}
    for name, model in made.items():
        logits = model(ids, attention_mask=mask).logits[:, :-1].float()
        per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets,
                                                      reduction="none")
        per_token[targets != -100].mean().backward()
        losses[name] = per_token[targets != -100].detach()
        grads[name] = {p_name: p.grad.float() for p_name, p in model.named_parameters() if p.grad is not None}
    base = baseline_implementation(family)
    assert_close(f"{family} per-token losses", losses["flashext"], losses["truth"], losses[base])
    assert grads["flashext"].keys() == grads["truth"].keys()
    for p_name, truth in grads["truth"].items():
        verdict = judge(f"{family} d{p_name}", grads["flashext"][p_name], truth, grads[base][p_name],
                        factor=GRADIENT_FACTOR)
        assert verdict.ok, str(verdict)


def test_static_cache_generate_under_torch_compile():
    """generate() with a static cache and the model's forward compiled: the same tokens as the
    eager run with the dynamic cache (or a divergence the rule explains)."""
    made = models("llama", torch.bfloat16)
    ids, mask = padded_batch("left", seqlen=17, lengths=(17, 9, 4))
    eager = greedy(made["flashext"], ids, mask, 12)
    compiled_model = family_model("llama", "flashext", torch.bfloat16, DEVICE)
    compiled_model.forward = torch.compile(compiled_model.forward)
    # this compiled forward only (transformers compiles static-cache decoding itself where it can)
    only_ours = {"disable_compile": True} if hasattr(transformers.GenerationConfig(), "disable_compile") else {}
    compiled = greedy(compiled_model, ids, mask, 12, cache_implementation="static", **only_ours)
    for line in check_greedy_agrees("static cache, compiled", compiled, eager, made["truth"], ids, mask):
        print(line)
