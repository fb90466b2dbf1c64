"""flashext.integrations.transformers on CPU: registration, and the integration's own logic —
padding (left and right) through the varlen path, packed sequences, caches in generate(),
gradients — with flashext's kernels replaced by the reference (the kernels are CUDA-only;
test_transformers_gpu.py compares the real thing). Skips when transformers is not installed."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flashext  # noqa: E402
import flashext.integrations.transformers as integration  # noqa: E402
from flashext import reference as ref  # noqa: E402
from tests.hf_families import FAMILIES, family_model  # noqa: E402

CALLS = {"dense": 0, "varlen": 0, "varlen_rows": []}


@pytest.fixture(autouse=True)
def reference_kernels(monkeypatch):
    """flashext's attention entry points replaced by the reference (float64, cast back)."""
    CALLS.update(dense=0, varlen=0, varlen_rows=[])

    def dense(q, k, v, **kwargs):
        CALLS["dense"] += 1
        return ref.attention(q, k, v, **kwargs).to(q.dtype)

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, validate=None, **kwargs):
        CALLS["varlen"] += 1
        CALLS["varlen_rows"].append(q.shape[0])
        assert int((cu_q.diff()).max()) <= max_q and int((cu_k.diff()).max()) <= max_k  # the bounds hold
        return ref.attention_varlen(q, k, v, cu_q, cu_k, **kwargs).to(q.dtype)

    monkeypatch.setattr(flashext, "flash_attention", dense)
    monkeypatch.setattr(flashext, "flash_attention_varlen", varlen)


def tiny_llama(implementation, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, **overrides)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.set_attn_implementation(implementation)
    return model


def test_registered_under_its_name():
    from transformers import AttentionInterface

    assert "flashext" in AttentionInterface._global_mapping
    model = tiny_llama("flashext")
    assert model.config._attn_implementation == "flashext"


def test_unpadded_batch_matches_eager_and_uses_the_dense_path():
    ids = torch.randint(0, 97, (2, 20))
    ours, eager = tiny_llama("flashext"), tiny_llama("eager")
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, eager(ids).logits, rtol=3e-2, atol=3e-2)
    assert CALLS["dense"] == 2 and CALLS["varlen"] == 0


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_goes_through_varlen_and_matches_eager(side):
    ids = torch.randint(0, 97, (3, 16))
    mask = torch.ones(3, 16, dtype=torch.long)
    for row, pad in enumerate((0, 5, 11)):
        if pad:
            mask[row, :pad] = 0 if side == "left" else 1
            if side == "right":
                mask[row, 16 - pad:] = 0
    ours, eager = tiny_llama("flashext"), tiny_llama("eager")
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).logits
        b = eager(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(a[real], b[real], rtol=3e-2, atol=3e-2)
    assert CALLS["varlen"] == 2 and CALLS["dense"] == 0


def test_packed_sequences_equal_separate_runs():
    lengths = [7, 5, 9]
    ids = torch.randint(0, 97, (1, sum(lengths)))
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    ours = tiny_llama("flashext")
    with torch.no_grad():
        packed = ours(ids, position_ids=position_ids).logits[0]
        start = 0
        for n in lengths:
            alone = ours(ids[:, start:start + n]).logits[0]
            torch.testing.assert_close(packed[start:start + n], alone, rtol=3e-2, atol=3e-2)
            start += n
    assert CALLS["varlen"] >= 2


def test_generate_with_a_cache_matches_eager():
    ids = torch.randint(0, 97, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding, as generation uses
    kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    ours = tiny_llama("flashext").generate(ids, attention_mask=mask, **kwargs)
    eager = tiny_llama("eager").generate(ids, attention_mask=mask, **kwargs)
    assert torch.equal(ours, eager)


def test_generate_with_a_static_cache_matches_the_dynamic_cache():
    """A static cache is longer than the padding mask transformers passes: its unfilled slots must be
    left out (keys past the mask), or every row but the first reads the wrong keys."""
    ids = torch.randint(1, 97, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :6] = 0
    kwargs = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    model = tiny_llama("flashext")
    dynamic = model.generate(ids, attention_mask=mask, **kwargs)
    static = model.generate(ids, attention_mask=mask, cache_implementation="static", **kwargs)
    assert torch.equal(static, dynamic)


def test_gradients_flow_and_match_eager():
    ids = torch.randint(0, 97, (2, 12))
    losses, grads = [], []
    for implementation in ("flashext", "eager"):
        model = tiny_llama(implementation).float()
        loss = model(ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
        grads.append(model.model.layers[0].self_attn.q_proj.weight.grad)
    assert abs(losses[0] - losses[1]) < 2e-2
    torch.testing.assert_close(grads[0], grads[1], rtol=0.1, atol=5e-3)


def test_unsupported_requests_are_refused():
    model = tiny_llama("flashext")
    with pytest.raises(NotImplementedError, match="output_attentions"):
        model(torch.randint(0, 97, (1, 5)), output_attentions=True)
    assert integration._window(None) == (-1, -1) and integration._window(4096) == (4095, -1)


def family_models(family):
    """The same random tiny model of a family once per attention implementation."""
    return {implementation: family_model(family, implementation) for implementation in ("flashext", "eager")}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_decoder_families_with_padding_match_eager(family):
    models = family_models(family)
    ids = torch.randint(0, 97, (2, 14))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with torch.no_grad():
        ours = models["flashext"](ids, attention_mask=mask).logits
        eager = models["eager"](ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], eager[real], rtol=3e-2, atol=3e-2)
    assert CALLS["varlen"] == 2  # one per layer, through the varlen path


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "bert"])
def test_apply_flashext_fuses_bias_gelu_and_keeps_the_outputs(family, monkeypatch):
    fused = {"calls": 0}

    def bias_gelu(x, bias, approximate="none"):
        fused["calls"] += 1
        return ref.bias_gelu(x, bias, approximate).to(x.dtype)

    monkeypatch.setattr(flashext, "bias_gelu", bias_gelu)
    if family == "gpt2":
        config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=97, bos_token_id=0,
                                         eos_token_id=0)
        make = lambda: transformers.GPT2LMHeadModel(config)  # noqa: E731
    elif family == "gpt_neox":
        config = transformers.GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, vocab_size=97)
        make = lambda: transformers.GPTNeoXForCausalLM(config)  # noqa: E731
    else:
        config = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, vocab_size=97)
        make = lambda: transformers.BertModel(config)  # noqa: E731
    torch.manual_seed(0)
    plain = make().eval()
    patched = make().eval()
    patched.load_state_dict(plain.state_dict())
    keys = set(patched.state_dict())
    done = integration.apply_flashext(patched, attention=family != "bert")
    assert done["bias_gelu"] == 2 and set(patched.state_dict()) == keys
    ids = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        want = plain(ids)[0]
        got = patched(ids)[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert fused["calls"] == 2


def test_unpad_indices_found_once_per_mask():
    """Every layer passes the same mask: its indices come from one nonzero() (a host sync), not one
    per layer; a changed mask is read again."""
    from flashext.integrations import transformers as integration

    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    first = integration._unpad_indices(mask, 4)
    assert all(a is b for a, b in zip(first, integration._unpad_indices(mask, 4)))
    assert torch.equal(first[0], torch.tensor([0, 1, 4, 5, 6, 7]))
    assert torch.equal(first[2], torch.tensor([0, 2, 6], dtype=torch.int32))
    mask[0, 2] = 1  # in place: the cached indices no longer hold
    again = integration._unpad_indices(mask, 4)
    assert torch.equal(again[0], torch.tensor([0, 1, 2, 4, 5, 6, 7]))
    decode = integration._unpad_indices(mask, 1)  # one query per row, the last position: padding in row 0
    assert torch.equal(decode[1], torch.tensor([1])) and torch.equal(decode[2], torch.tensor([0, 0, 1], dtype=torch.int32))


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_free_runs_the_real_tokens_only_and_matches_eager(family, side):
    """apply_flashext(padding_free=True): every layer sees only the real tokens (varlen over their
    count, not B x S), logits on real tokens match eager, the padding's are 0."""
    models = family_models(family)
    done = integration.apply_flashext(models["flashext"], bias_gelu=False, padding_free=True)
    assert done["padding_free"]
    ids = torch.randint(0, 97, (3, 14))
    mask = torch.ones_like(ids)
    for row, pad in enumerate((0, 4, 9)):
        if pad:
            if side == "left":
                mask[row, :pad] = 0
            else:
                mask[row, 14 - pad:] = 0
    with torch.no_grad():
        ours = models["flashext"](ids, attention_mask=mask).logits
        eager = models["eager"](ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], eager[real], rtol=3e-2, atol=3e-2)
    assert CALLS["varlen"] == 2 and CALLS["varlen_rows"] == [int(mask.sum())] * 2, CALLS
    assert not ours[~real].any()


def test_padding_free_training_step_matches_and_generate_keeps_its_cache():
    ids = torch.randint(0, 97, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # right padding, as training batches are
    mask[2, 3:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    losses, grads = [], []
    for padding_free in (True, False):
        model = tiny_llama("flashext").float().train()
        integration.apply_flashext(model, padding_free=padding_free)
        loss = model(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        losses.append(loss.item())
        grads.append(model.model.layers[0].self_attn.q_proj.weight.grad)
    assert abs(losses[0] - losses[1]) < 1e-4
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-3, atol=1e-5)
    ids = torch.randint(0, 97, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    kwargs = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    patched = tiny_llama("flashext")
    integration.apply_flashext(patched, padding_free=True)
    assert torch.equal(patched.generate(ids, attention_mask=mask, **kwargs),
                       tiny_llama("eager").generate(ids, attention_mask=mask, **kwargs))
    with torch.no_grad():
        out = patched(ids, attention_mask=mask, use_cache=True)  # a cache asked for: the decoder unchanged
    cache = out.get("cache", out.get("past_key_values"))  # its name since transformers 5.x, and before
    assert cache is not None and out.logits[mask == 0].any()  # not packed: a cache, and no zeros at padding


def test_padding_free_needs_a_decoder_and_the_attention():
    with pytest.raises(ValueError, match="padding_free=True needs attention=True"):
        integration.apply_flashext(tiny_llama("eager"), attention=False, padding_free=True)
    bert = transformers.BertModel(transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                                          num_attention_heads=4, vocab_size=97))
    with pytest.raises(ValueError, match="needs a decoder model"):
        integration.apply_flashext(bert, padding_free=True)
