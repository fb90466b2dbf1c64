"""python -m flashext: check every kernel against the reference on fresh random data, then time it.

With a GPU the build covers: the CUDA kernels (GeLU forward and backward, each dtype, both forms;
attention forward, output and lse, causal and not) and their Triton twins are judged by
flashext.testing's rule, and a short table compares their speed with eager PyTorch and a
device-to-device copy. Without a GPU: says so, runs the Triton twins under the interpreter on the
CPU against the reference, and exits 0 when they pass (built or not). With a GPU that the build
does not cover, or no build: says why and how to fix it, checks the Triton twins on the GPU and
exits 1. Exits 1 when any check fails.
"""

from __future__ import annotations

import os
import sys

import torch


def _cases(device: str, n: int, shape: tuple[int, int], attn_shape: tuple[int, int, int, int, int]):
    """(name, run, reference, pytorch-in-dtype baseline, factor) for every op, dtype and form."""
    import torch.nn.functional as F

    from flashext import reference as ref
    from flashext.testing import FORWARD_FACTOR, GRADIENT_FACTOR

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for approx in ("none", "tanh"):
            x = (torch.randn(n, device=device) * 2).to(dtype)
            y = (torch.randn(n, device=device) * 2).to(dtype)
            g = torch.randn(n, device=device).to(dtype)
            xb = (torch.randn(*shape, device=device) * 2).to(dtype)
            b = torch.randn(shape[1], device=device).to(dtype)
            gb = torch.randn(*shape, device=device).to(dtype)
            tag = f"{str(dtype).removeprefix('torch.'):8s} {approx:4s}"
            base_bwd = torch.ops.aten.gelu_backward(gb, xb + b, approximate=approx)
            want_gx, want_gb = ref.bias_gelu_backward(gb, xb, b, approx)
            yield (f"add_gelu      fwd {tag}", ("add", x, y, approx), ref.add_gelu(x, y, approx),
                   F.gelu(x + y, approximate=approx), FORWARD_FACTOR)
            yield (f"add_gelu      bwd {tag}", ("add_bwd", g, x, y, approx), ref.add_gelu_backward(g, x, y, approx),
                   torch.ops.aten.gelu_backward(g, x + y, approximate=approx), GRADIENT_FACTOR)
            yield (f"bias_gelu     fwd {tag}", ("bias", xb, b, approx), ref.bias_gelu(xb, b, approx),
                   F.gelu(xb + b, approximate=approx), FORWARD_FACTOR)
            yield (f"bias_gelu dx  bwd {tag}", ("bias_bwd_x", gb, xb, b, approx), want_gx, base_bwd, GRADIENT_FACTOR)
            yield (f"bias_gelu db  bwd {tag}", ("bias_bwd_b", gb, xb, b, approx), want_gb,
                   base_bwd.sum(0), GRADIENT_FACTOR)
        if dtype == torch.float32:
            continue
        batch, seqlen, heads, heads_kv, head_dim = attn_shape
        q = torch.randn(batch, seqlen, heads, head_dim, device=device).to(dtype)
        k = torch.randn(batch, seqlen + 13, heads_kv, head_dim, device=device).to(dtype)
        v = torch.randn(batch, seqlen + 13, heads_kv, head_dim, device=device).to(dtype)
        tag = f"{str(dtype).removeprefix('torch.'):8s}"
        for causal in (False, True):
            want, want_lse = ref.attention(q, k, v, causal=causal, return_lse=True)
            base, base_lse = ref.attention(q, k, v, causal=causal, return_lse=True, compute_dtype=dtype)
            mode = "causal" if causal else "full"
            yield (f"attention out {mode:6s} {tag}", ("attn_out", q, k, v, causal), want, base, FORWARD_FACTOR)
            yield (f"attention lse {mode:6s} {tag}", ("attn_lse", q, k, v, causal), want_lse, base_lse.float(),
                   FORWARD_FACTOR)


def _run(impl, call):
    kind, *args = call
    if kind == "add":
        return impl["add"](*args)
    if kind == "add_bwd":
        return impl["add_bwd"](*args)
    if kind == "bias":
        return impl["bias"](*args)
    if kind in ("attn_out", "attn_lse"):
        q, k, v, causal = args
        out, lse = impl["attn"](q, k, v, causal)
        return out if kind == "attn_out" else lse
    grad_x, grad_b = impl["bias_bwd"](*args)
    return grad_x if kind == "bias_bwd_x" else grad_b


def _check(impls: dict, device: str, n: int, shape, attn_shape) -> bool:
    from flashext.testing import judge

    all_ok = True
    print(f"{'kernel':34s} " + "  ".join(f"{name:>24s}" for name in impls))
    for name, call, want, base, factor in _cases(device, n, shape, attn_shape):
        cells = []
        for impl in impls.values():
            verdict = judge(name, _run(impl, call), want, base, factor)
            all_ok &= verdict.ok
            cells.append(f"{verdict.error:9.2e} <= {verdict.allowed:8.2e} {'ok' if verdict.ok else 'FAIL'}")
        print(f"{name:34s} " + "  ".join(f"{c:>24s}" for c in cells))
    return all_ok


def _speed_table() -> None:
    import torch.nn.functional as F
    import triton.testing

    print("\nspeed, GB/s (tensors moved / median time, L2 flushed; copy = same bytes, device to device)")
    ops = torch.ops.flashext
    for dtype in (torch.float32, torch.bfloat16):
        n = 2**26
        x, y = torch.randn(n, device="cuda").to(dtype), torch.randn(n, device="cuda").to(dtype)
        es = x.element_size()
        src = torch.empty(3 * n // 2, device="cuda", dtype=dtype).normal_()
        dst = torch.empty_like(src)
        timed = {
            "flashext add_gelu": lambda: ops.add_gelu(x, y, "none"),
            "eager F.gelu(x + y)": lambda: F.gelu(x + y),
            "copy (same bytes)": lambda: dst.copy_(src),
        }
        for label, fn in timed.items():
            ms = triton.testing.do_bench(fn, return_mode="median")
            print(f"  {str(dtype).removeprefix('torch.'):8s} n=2^26  {label:22s} {3 * n * es / ms / 1e6:8.0f}")


def _summary(info: dict) -> str:
    """Two lines a person can read: what the build holds, and the device."""
    head = f"flashext {info['version']} (torch {info['torch']})"
    if not info["built"]:
        build = f"{head}: {info['import_error']}"
    else:
        code = "with PTX" if info["ptx"] else "machine code only"
        archs = ", ".join(info["cuda_archs"])
        build = f"{head}: CUDA extension built for {archs} ({code}), CUDA {info['cuda_runtime']}"
    if info["device"] is None:
        return build + "\ndevice: no CUDA device is visible"
    fit = "this build runs on it" if info["device_supported"] else "this build has no kernels for it"
    if info["hopper_kernels"]:
        fit += ", with its Hopper (sm_90a) kernels"
    return build + f"\ndevice: {info['device']}, compute capability {info['device_capability']}: {fit}"


def _rebuild_hint(capability: str) -> str:
    major, minor = (int(p) for p in capability.split("."))
    if major < 8:
        return "flashext's kernels need compute capability 8.0 or newer."
    arch = "90a" if (major, minor) == (9, 0) else f"{major}{minor}"
    return (f'Rebuild for it: FLASHEXT_CUDA_ARCHS="{arch}" pip install --no-build-isolation . '
            '("compute_80" embeds PTX that runs on any GPU >= 8.0).')


def _twins(device: str) -> dict:
    from flashext.triton_ref import attention as twin_attention
    from flashext.triton_ref import gelu as twin

    blocks = {"block_m": 16, "block_n": 16} if device == "cpu" else {}  # small tiles: the interpreter is slow
    return {"add": twin.add_gelu, "add_bwd": twin.add_gelu_backward, "bias": twin.bias_gelu,
            "bias_bwd": twin.bias_gelu_backward,
            "attn": lambda q, k, v, causal: twin_attention.flash_attention(q, k, v, causal=causal, **blocks)}


def main() -> int:
    import flashext

    info = flashext.build_info()
    print(_summary(info) + "\n")
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))  # fresh data every run

    if not torch.cuda.is_available():
        print("The CUDA kernels cannot run without a GPU. Checking the Triton twins in interpreter mode "
              "(TRITON_INTERPRET=1) on the CPU instead.\n")
        ok = _check({"triton twin (interpreter)": _twins("cpu")}, "cpu", 4099, (37, 264), (1, 40, 4, 2, 64))
        print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
        return 0 if ok else 1

    if not info["device_supported"]:
        why = _rebuild_hint(info["device_capability"]) if info["built"] else "the extension is not loaded (above)."
        print(f"The CUDA kernels cannot run here: {why} Checking the Triton twins on the GPU only.\n")
        ok = _check({"triton twin": _twins("cuda")}, "cuda", 2**20 + 3, (1027, 1024), (2, 300, 6, 2, 128))
        print("\nTriton twins " + ("passed" if ok else "FAILED") + "; the CUDA kernels were not checked")
        return 1
    ops = torch.ops.flashext
    impls = {
        "flashext CUDA": {"add": ops.add_gelu, "add_bwd": ops.add_gelu_backward, "bias": ops.bias_gelu,
                          "bias_bwd": ops.bias_gelu_backward,
                          "attn": lambda q, k, v, causal: flashext.flash_attention(q, k, v, causal=causal, return_lse=True)},
        "triton twin": _twins("cuda"),
    }
    ok = _check(impls, "cuda", 2**20 + 3, (1027, 1024), (2, 300, 6, 2, 128))
    _speed_table()
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before flashext.triton_ref is imported
    sys.exit(main())
