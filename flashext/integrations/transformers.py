"""flashext as a Hugging Face transformers attention backend:

    import flashext.integrations.transformers  # registers "flashext"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="flashext")
    model.set_attn_implementation("flashext")  # or on a loaded model

Registers `flashext_attention_forward` with transformers' AttentionInterface, and transformers'
flash-attention mask (a 2D padding mask, or None when nothing is padded; with a static cache always
the mask, shorter than the cache, whose unfilled slots are then left out) with AttentionMaskInterface,
under the name "flashext". The function takes transformers' (B, H, S, D) query/key/value, causal or
not as the module says, the model's scaling, sliding window and softcap, and:
  - no padding: flashext.flash_attention on transposed views (no copies);
  - a 2D padding mask (left or right padding): the valid tokens only, through
    flashext.flash_attention_varlen (no computation on padding), scattered back (padding rows 0);
  - packed sequences (batch 1, position_ids restarting, or the collator's cu_seq_lens_q/k):
    flash_attention_varlen over the sequences.
With a KV cache (generate), Sq < Sk and the queries align bottom-right, as in flash-attn.
Gradients flow (flashext's backward). Dropout > 0 while training and output_attentions raise.
apply_flashext(model) does that and fuses biased-Linear + GeLU MLPs (GPT-2, GPT-NeoX, BERT, ViT)
into flashext.bias_gelu, Liger-style; with padding_free=True a padded batch's forward without a
cache (training, scoring) packs the real tokens before the decoder's first layer, so the
projections and MLPs skip the padding too, not only the attention. Needs the `transformers` package (pip install
flashext[transformers]).
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import Tensor

import flashext

NAME = "flashext"


def _cu_seqlens(lengths: Tensor) -> Tensor:
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    cu[1:] = lengths.cumsum(0)
    return cu


def _window(sliding_window: int | None) -> tuple[int, int]:
    # transformers' sliding_window counts the token itself: a query sees the window - 1 keys before it
    return (-1, -1) if sliding_window is None else (int(sliding_window) - 1, -1)


# The last padding mask's indices and offsets: every layer of a forward passes the same mask, and
# nonzero() is a host sync, so they are found once per forward rather than once per layer.
_UNPAD_CACHE: list = []


def _unpad_indices(mask: Tensor, seqlen_q: int):
    """(keys, queries, cu_seqlens_q, cu_seqlens_k) of a (B, Sk) padding mask: the flat indices of
    the real tokens (the queries: the last seqlen_q positions of each row) and their offsets."""
    eager = not torch.compiler.is_compiling()
    if eager and _UNPAD_CACHE:
        cached, version, cached_seqlen_q, result = _UNPAD_CACHE[0]
        if cached is mask and version == mask._version and cached_seqlen_q == seqlen_q:
            return result
    real = mask.bool()
    lengths_k = real.sum(dim=-1, dtype=torch.int32)
    keys = real.reshape(-1).nonzero().view(-1)
    if seqlen_q == real.shape[1]:  # prefill: the queries are the same tokens
        queries, lengths_q = keys, lengths_k
    else:  # with a cache: the last seqlen_q positions of each row are the queries
        query_mask = real[:, -seqlen_q:]
        lengths_q = query_mask.sum(dim=-1, dtype=torch.int32)
        queries = query_mask.reshape(-1).nonzero().view(-1)
    result = (keys, queries, _cu_seqlens(lengths_q), _cu_seqlens(lengths_k))
    if eager:
        _UNPAD_CACHE[:] = [(mask, mask._version, seqlen_q, result)]
    return result


def _unpadded(q: Tensor, k: Tensor, v: Tensor, mask: Tensor):
    """(B, S, H, D) q, k, v and a (B, Sk) padding mask (True or 1 = a real token) → the real tokens
    packed, their offsets and maxima, and the query rows' indices to scatter the output back."""
    batch, seqlen_q = q.shape[:2]
    if k.shape[1] > mask.shape[1]:  # a static cache: the slots past the mask are not filled yet
        k, v = k[:, : mask.shape[1]], v[:, : mask.shape[1]]
    keys, queries, cu_q, cu_k = _unpad_indices(mask, seqlen_q)
    packed_q = q.reshape(batch * seqlen_q, *q.shape[2:])[queries]
    packed_k = k.reshape(-1, *k.shape[2:])[keys]
    packed_v = v.reshape(-1, *v.shape[2:])[keys]
    # the padded lengths bound the real ones: no host read of the maxima (blocks past a sequence's
    # end exit at once)
    return packed_q, packed_k, packed_v, cu_q, cu_k, seqlen_q, mask.shape[1], queries


def _packed_offsets(position_ids: Tensor | None, kwargs: dict):
    """cu_seqlens of packed sequences (the collator's, or from position_ids restarting), or None."""
    if kwargs.get("cu_seq_lens_q") is not None:
        return (kwargs["cu_seq_lens_q"].int(), kwargs["cu_seq_lens_k"].int(), int(kwargs["max_length_q"]),
                int(kwargs["max_length_k"]))
    if position_ids is None or position_ids.shape[0] != 1 or position_ids.shape[-1] == 1:
        return None
    flat = position_ids.reshape(-1)
    starts = (flat == flat.min()).nonzero().view(-1)
    if starts.numel() <= 1:
        return None  # one sequence: the dense path
    cu = torch.cat([starts, torch.tensor([flat.numel()], device=flat.device)]).int()
    return cu, cu, flat.numel(), flat.numel()  # bounds of the longest sequence, read without a sync


def flashext_attention_forward(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                               attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                               sliding_window: int | None = None, softcap: float | None = None,
                               is_causal: bool | None = None, **kwargs) -> tuple[Tensor, None]:
    """transformers' attention-function signature: query (B, H, Sq, D), key/value (B, Hkv, Sk, D);
    returns (out (B, Sq, H, D), None)."""
    if kwargs.get("output_attentions", False):
        raise NotImplementedError("flashext attention does not return attention weights (output_attentions=True); "
                                  "use attn_implementation='eager' for them")
    if dropout != 0.0 and module.training:
        raise NotImplementedError(f"flashext attention has no dropout (the model asks for {dropout} while training)")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # (B, S, H, D) views
    target = q.dtype if q.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    if q.dtype == torch.float32 and torch.is_autocast_enabled(q.device.type):
        target = torch.get_autocast_dtype(q.device.type)
    q, k, v = (t.to(target) for t in (q, k, v))
    options = {"causal": bool(causal), "softmax_scale": scaling, "window_size": _window(sliding_window),
               "softcap": float(softcap or 0.0)}
    if attention_mask is not None and attention_mask.dim() == 2:
        packed_q, packed_k, packed_v, cu_q, cu_k, max_q, max_k, rows = _unpadded(q, k, v, attention_mask)
        # offsets built here are valid by construction: no validation (a host sync in every layer)
        out = flashext.flash_attention_varlen(packed_q, packed_k, packed_v, cu_q, cu_k, max_q, max_k, validate=False,
                                              **options)
        full = out.new_zeros(q.shape[0] * q.shape[1], *out.shape[1:])
        full[rows] = out
        return full.view(*q.shape[:2], *out.shape[1:]).to(query.dtype), None
    if attention_mask is not None:
        raise NotImplementedError("flashext attention takes a 2D padding mask (transformers' flash-attention mask); "
                                  f"got a {attention_mask.dim()}-D mask")
    packed = _packed_offsets(kwargs.get("position_ids"), kwargs)
    if packed is not None:
        cu_q, cu_k, max_q, max_k = packed
        out = flashext.flash_attention_varlen(q[0], k[0], v[0], cu_q, cu_k, max_q, max_k, validate=False, **options)
        return out[None].to(query.dtype), None
    return flashext.flash_attention(q, k, v, **options).to(query.dtype), None


class _BiasGelu(torch.nn.Module):
    """Stands in for a model's GeLU after `linear`, whose bias it adds (the linear then runs without
    it): flashext.bias_gelu(h, bias), one pass over h. The linear is held, not registered, so the
    model's parameters and state_dict keys do not change."""

    def __init__(self, linear: torch.nn.Module, approximate: str):
        super().__init__()
        object.__setattr__(self, "_linear", linear)
        self.approximate = approximate

    def forward(self, h: Tensor) -> Tensor:
        bias = self._linear.bias
        return flashext.bias_gelu(h, bias.to(h.dtype), self.approximate)


def _gelu_kind(act: torch.nn.Module) -> str | None:
    """"none" (erf) or "tanh" for the GeLU modules transformers and torch use; None for anything else."""
    from transformers import activations

    if isinstance(act, torch.nn.GELU):
        return act.approximate
    tanh_kinds = tuple(getattr(activations, n) for n in ("NewGELUActivation", "GELUTanh", "PytorchGELUTanh")
                       if hasattr(activations, n))
    if isinstance(act, tanh_kinds):
        return "tanh"
    if type(act) is getattr(activations, "GELUActivation", None):
        return "none"
    return None


# (input projection, activation) attribute pairs of MLPs whose input projection has a bias:
# GPT-2 (a Conv1D), GPT-NeoX, BERT / RoBERTa / ViT intermediate layers, OPT / CLIP-style fc1.
_MLP_PAIRS = (("c_fc", "act"), ("dense_h_to_4h", "act"), ("dense", "intermediate_act_fn"), ("fc1", "activation_fn"))


def _drop_bias(linear: torch.nn.Module) -> bool:
    """Makes `linear` (nn.Linear or transformers' Conv1D) skip its bias; False if it is neither."""
    if isinstance(linear, torch.nn.Linear):
        linear.forward = lambda x, linear=linear: torch.nn.functional.linear(x, linear.weight)
        return True
    if type(linear).__name__ == "Conv1D":  # GPT-2: weight (in, out), x @ W + b
        linear.forward = lambda x, linear=linear: x @ linear.weight
        return True
    return False


_CACHE_ARGS = ("past_key_values", "cache")  # the cache argument's name before and since transformers 5.x


def _padding_free(decoder: torch.nn.Module) -> None:
    """Wrap a decoder stack's forward (LlamaModel, GPT2Model, ...): a call with a 2D padding mask that
    pads something, and no cache given or asked for, runs on the real tokens only, packed into one
    row with their own positions and the sequences' offsets (cu_seq_lens_q/k, which reach
    flashext_attention_forward), and its hidden states are scattered back to (B, S, ...) with 0 at
    the padding. Any other call runs the decoder unchanged."""
    original = decoder.forward
    if getattr(original, "_flashext_padding_free", False):
        return
    signature = inspect.signature(original)
    var_keyword = next((n for n, p in signature.parameters.items() if p.kind is p.VAR_KEYWORD), None)

    @functools.wraps(original)
    def forward(*args, **kwargs):
        bound = signature.bind_partial(*args, **kwargs).arguments
        extra = bound.pop(var_keyword, {}) if var_keyword else {}
        call = {**bound, **extra}
        mask, ids, embeds = call.get("attention_mask"), call.get("input_ids"), call.get("inputs_embeds")
        if (mask is None or mask.dim() != 2 or call.get("use_cache") or any(call.get(n) is not None for n in _CACHE_ARGS)
                or call.get("cu_seq_lens_q") is not None):
            return original(*args, **kwargs)
        batch, seqlen = mask.shape
        rows, _, cu, _ = _unpad_indices(mask, seqlen)  # the forward's one host sync (nonzero)
        if rows.numel() == mask.numel():  # nothing padded; the layers find these indices cached
            return original(*args, **kwargs)
        positions = call.get("position_ids")  # the model's own default: 0 … S-1 in every row
        positions = torch.arange(seqlen, device=mask.device) if positions is None else positions
        # S bounds every length: no host read of the longest (blocks past a sequence's end exit)
        call.update(attention_mask=None, use_cache=False,
                    position_ids=positions.expand(batch, seqlen).reshape(-1)[rows][None],
                    cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=seqlen, max_length_k=seqlen)
        if ids is not None:
            call["input_ids"] = ids.reshape(-1)[rows][None]
        if embeds is not None:
            call["inputs_embeds"] = embeds.reshape(batch * seqlen, -1)[rows][None]

        def scatter(h: Tensor) -> Tensor:
            return h.new_zeros(batch * seqlen, *h.shape[2:]).index_copy(0, rows, h[0]).view(batch, seqlen,
                                                                                              *h.shape[2:])

        out = original(**call)
        if isinstance(out, tuple):
            return (scatter(out[0]),) + out[1:]
        out.last_hidden_state = scatter(out.last_hidden_state)
        if getattr(out, "hidden_states", None) is not None:
            out.hidden_states = tuple(scatter(h) for h in out.hidden_states)
        return out

    forward._flashext_padding_free = True
    decoder.forward = forward


def apply_flashext(model: torch.nn.Module, attention: bool = True, bias_gelu: bool = True,
                   padding_free: bool = False) -> dict:
    """Liger-style patching of a transformers model in place: its attention implementation set to
    "flashext" (where the model supports custom attention), and every biased projection followed by
    a GeLU (exact or tanh, as the model's activation is) fused into flashext.bias_gelu.

    padding_free=True (decoder models, with attention): a padded batch's forward without a cache
    (training, scoring; generate() keeps its cache and runs as before) skips the padding in every
    layer, not only in the attention: the real tokens are packed before the first layer and the
    hidden states scattered back after the last (0 at padding positions, so their logits are 0;
    give them label -100, as for any padding). It returns no cache. The packing holds a host sync
    and data-dependent shapes, so torch.compile breaks the graph around the decoder's call.

    Returns what was changed: {"attention": bool, "bias_gelu": number of MLPs fused,
    "padding_free": bool}."""
    done = {"attention": False, "bias_gelu": 0, "padding_free": False}
    if attention and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(NAME)
        done["attention"] = True
    if padding_free:
        if not done["attention"]:
            raise ValueError("apply_flashext: padding_free=True needs attention=True (the packed sequences' "
                             "offsets are read by flashext's attention function)")
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        causal = any(getattr(m, "is_causal", False) is True for m in model.modules())  # packing keeps causal masks
        if (decoder is None or not causal or
                "attention_mask" not in inspect.signature(decoder.forward).parameters):
            raise ValueError(f"apply_flashext: padding_free=True needs a decoder model; "
                             f"{type(model).__name__} has no causal decoder stack taking attention_mask")
        _padding_free(decoder)
        done["padding_free"] = True
    if bias_gelu:
        for module in model.modules():
            for linear_name, act_name in _MLP_PAIRS:
                linear, act = getattr(module, linear_name, None), getattr(module, act_name, None)
                if linear is None or act is None or getattr(linear, "bias", None) is None:
                    continue
                kind = _gelu_kind(act)
                if kind is not None and _drop_bias(linear):
                    setattr(module, act_name, _BiasGelu(linear, kind))
                    done["bias_gelu"] += 1
    return done


def _teach_flash_loader() -> None:
    """transformers treats every implementation whose name contains "flash" as a flash-attention
    package to import (lazy_import_flash_attention), and would look "flashext" up on the Hub. Its
    loader is taught the name: flash-attn's functions from flashext.compat.flash_attn, so that any
    transformers code path that calls them directly (e.g. paged continuous batching) runs flashext."""
    try:
        from transformers import modeling_flash_attention_utils as utils
    except ImportError:
        return
    original = getattr(utils, "_lazy_imports", None)
    if original is None or getattr(original, "_flashext", False):
        return

    def lazy_imports(implementation, *args, **kwargs):
        if implementation == NAME:
            from ..compat import flash_attn

            return (flash_attn.flash_attn_func, flash_attn.flash_attn_varlen_func, flash_attn.flash_attn_with_kvcache,
                    utils._pad_input, utils._unpad_input)
        return original(implementation, *args, **kwargs)

    lazy_imports._flashext = True
    utils._lazy_imports = lazy_imports


def register() -> None:
    """Register "flashext" with transformers' AttentionInterface (and its mask hook)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, flashext_attention_forward)
    _teach_flash_loader()
    try:
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError:  # older transformers: no mask registry (the flash mask is the 2D one already)
        return
    AttentionMaskInterface.register(NAME, flash_attention_mask)


register()
