"""Whether the GPU's boost clock treats two attention kernels alike: each implementation runs back
to back for a while, alone and long enough for the clock and the board's power to settle, while
NVML's SM clock, energy counter and clock-event reasons are read. Unlike bench_attention's rounds
(triton's do_bench: a 256 MB memset clears L2 before every call, and the GPU idles its SMs
meanwhile), the calls here follow each other on a warm L2: this is sustained load.

    python benchmarks/experiments/clock_probe.py [--seconds 1.5] [--shapes bf16:128:0:4096,...]
                                                  [--impls flashext,sdpa_cudnn]

A shape is dtype:head_dim:causal:seqlen on the forward grid (B · S = 16384, H · D = 2048). Each
implementation runs twice per shape, in the order A B B A, so a slow drift of the card's
temperature hits both alike. Printed per run, all over the run's second half (the first lets the
clock settle): ms a call, TFLOP/s, the SM clock's median, the mean power (energy over time),
TFLOP/s per GHz (what the kernel does per clock
cycle: level when the clocks alone separate two kernels), and the share of samples with the
software power cap or a thermal slowdown active. JSON to $OUT/clock_probe.json when OUT is set.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.bench_attention import DTYPES, implementations  # noqa: E402
from benchmarks.common import run_metadata, write_json  # noqa: E402

POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap
THERMAL = 0x20 | 0x40 | 0x8  # software / hardware thermal slowdown, hardware slowdown


class Nvml:
    """The NVML reads this probe needs, through ctypes (no pynvml on the GPU machine)."""

    def __init__(self, index: int = 0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self.handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(self.handle)) != 0:
            raise RuntimeError(f"no NVML device {index}")

    def _read(self, name: str, *args):
        if getattr(self.lib, name)(self.handle, *args) != 0:
            raise RuntimeError(f"{name} failed")

    def sample(self) -> tuple[int, int]:
        """The SM clock (MHz) and the clock-event reasons (a bit mask) now."""
        clock, reasons = ctypes.c_uint(), ctypes.c_ulonglong()
        self._read("nvmlDeviceGetClockInfo", 1, ctypes.byref(clock))  # NVML_CLOCK_SM
        self._read("nvmlDeviceGetCurrentClocksThrottleReasons", ctypes.byref(reasons))
        return clock.value, reasons.value

    def energy_mj(self) -> int:
        """The board's energy counter in millijoules (power readings are one-second averages on
        Ampere and newer; the counter's difference gives a window's own mean)."""
        energy = ctypes.c_ulonglong()
        self._read("nvmlDeviceGetTotalEnergyConsumption", ctypes.byref(energy))
        return energy.value


def run_sampled(nvml: Nvml, fn, seconds: float) -> dict:
    """Calls fn back to back for about `seconds`, in chunks of about 10 ms of GPU work with the next
    chunk queued before the last one is waited for (the GPU never idles), sampling NVML while it
    waits (one thread: a sampler thread would starve while a full launch queue holds the GIL)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    per_call = start.elapsed_time(end) / 5
    chunk = max(1, int(10.0 / per_call))
    chunks = max(4, int(seconds * 1e3 / (chunk * per_call)))
    # The second half's window: from the end of chunk `half` (its event, on the GPU's clock; the
    # energy read once that event has passed) to the last chunk's end.
    half = chunks // 2
    samples, marks, energy_start, wall_start = [], [], 0, 0.0
    for _ in range(chunks):
        for _ in range(chunk):
            fn()
        marks.append(torch.cuda.Event(enable_timing=True))
        marks[-1].record()
        if len(marks) >= 2:
            while not marks[-2].query():
                if len(marks) - 2 > half:
                    samples.append(nvml.sample())
                time.sleep(0.002)
            if len(marks) - 2 == half:
                energy_start, wall_start = nvml.energy_mj(), time.perf_counter()
    torch.cuda.synchronize()
    energy, wall = nvml.energy_mj() - energy_start, time.perf_counter() - wall_start
    settled = samples or [nvml.sample()]
    return {"ms": marks[half].elapsed_time(marks[-1]) / ((chunks - 1 - half) * chunk), "calls": chunks * chunk,
            "samples": len(settled), "sm_mhz": statistics.median(s[0] for s in settled),
            "watts": energy / 1e3 / wall,
            "power_capped": sum(bool(s[1] & POWER_CAP) for s in settled) / len(settled),
            "thermal": sum(bool(s[1] & THERMAL) for s in settled) / len(settled)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--shapes", default="bf16:128:0:2048,bf16:128:0:4096,bf16:128:0:16384,fp16:64:0:1024")
    parser.add_argument("--impls", default="flashext,sdpa_cudnn")
    args = parser.parse_args()
    nvml = Nvml()
    names = args.impls.split(",")
    rows = []
    print(f"{torch.cuda.get_device_name()}: each run {args.seconds} s, order A B B A")
    print(f"{'shape':24} {'impl':12} {'ms':>9} {'TFLOP/s':>8} {'SM MHz':>7} {'W':>6} {'TF/GHz':>7} {'capped':>6} {'therm':>6}")
    for shape in args.shapes.split(","):
        dname, head_dim, causal, seqlen = shape.split(":")
        head_dim, causal, seqlen = int(head_dim), bool(int(causal)), int(seqlen)
        batch, heads = 16384 // seqlen, 2048 // head_dim
        q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda").to(DTYPES[dname]) for _ in range(3))
        layouts = {"bshd": (q, k, v), "bhsd": tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))}
        flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
        impls = implementations(dname, head_dim)
        for name in names + names[::-1]:
            fn, layout = impls[name]
            got = run_sampled(nvml, lambda fn=fn, qkv=layouts[layout]: fn(*qkv, causal), args.seconds)
            got.update(shape=shape, impl=name, tflops=flops / got["ms"] / 1e9)
            got["tflops_per_ghz"] = got["tflops"] / (got["sm_mhz"] / 1e3)
            rows.append(got)
            print(f"{shape:24} {name:12} {got['ms']:9.4f} {got['tflops']:8.1f} {got['sm_mhz']:7.0f} "
                  f"{got['watts']:6.0f} {got['tflops_per_ghz']:7.1f} {got['power_capped']:6.2f} {got['thermal']:6.2f}",
                  flush=True)
        del q, k, v, layouts
    if os.environ.get("OUT"):  # (never into benchmarks/results: no README figure comes from it)
        print(f"wrote {write_json('clock_probe.json', {'meta': run_metadata(), 'rows': rows})}")


if __name__ == "__main__":
    main()
