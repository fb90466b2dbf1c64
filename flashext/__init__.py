"""flashext: hand-written CUDA kernels for PyTorch.

    import flashext
    out = flashext.fused_add_gelu(x, y)          # gelu(x + y), one pass over HBM
    out = flashext.bias_gelu(x, bias)            # gelu(x + bias), the epilogue after a Linear
    out = flashext.flash_attention(q, k, v, causal=True)   # exact attention, O(S) memory (v0)

Every op is a torch.library op (torch.ops.flashext.*) with a Meta kernel (its checks and output
shapes, for tracing) and, where it is differentiable, an autograd kernel, so it works in eager
mode, under autograd, torch.compile(fullgraph=True) and CUDA graphs.
"""

__version__ = "0.1.0"

from ._build import build_info
from .attention import (block_sparse_attention, flash_attention, flash_attention_varlen,
                        flash_attention_with_kvcache, merge_attention_states, scaled_dot_product_attention,
                        use_hopper_kernels)
from .softmax import online_softmax
from .gelu import bias_gelu, fused_add_gelu
from .integrations import sdpa as _sdpa

_sdpa.register()  # "flashext" in torch.nn.attention's flash registry; activating it is the user's call

__all__ = [
    "__version__",
    "build_info",
    "fused_add_gelu",
    "bias_gelu",
    "flash_attention",
    "flash_attention_varlen",
    "scaled_dot_product_attention",
    "flash_attention_with_kvcache",
    "merge_attention_states",
    "block_sparse_attention",
    "online_softmax",
    "use_hopper_kernels",
]
