"""Tiny random-initialised models of the decoder families transformers ships, shared by the
integration's CPU tests (test_transformers_integration.py) and GPU tests (test_transformers_gpu.py):
Llama-style GQA, Mistral sliding windows, Qwen2, Gemma 2 (softcap, alternating windows), Gemma 3,
GPT-NeoX and GPT-2."""

from __future__ import annotations

import torch

VOCAB = 97
FAMILIES = {  # family: (config class, model class, config arguments; None: GPT-2's own names)
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"num_key_value_heads": 2}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_key_value_heads": 2, "sliding_window": 6}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 2}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"num_key_value_heads": 2, "head_dim": 16, "sliding_window": 6}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"num_key_value_heads": 2, "head_dim": 16,
                                                         "sliding_window": 6}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", None),
}


def family_config(family: str):
    import transformers

    config_name, _, extra = FAMILIES[family]
    if extra is None:  # GPT-2 names its sizes its own way; no dropout, so training steps compare
        kwargs = {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": VOCAB, "bos_token_id": 0, "eos_token_id": 0,
                  "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}
    else:
        kwargs = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "vocab_size": VOCAB, "max_position_embeddings": 256, **extra}
    return getattr(transformers, config_name)(**kwargs)


def family_model(family: str, implementation: str, dtype=torch.bfloat16, device="cpu"):
    """The family's tiny model, the same weights for every call (seed 0), in eval mode, with the
    given attention implementation (a config of its own: the config records the choice)."""
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, FAMILIES[family][1])(family_config(family))
    model = model.to(device=device, dtype=dtype).eval()
    model.set_attn_implementation(implementation)
    return model
