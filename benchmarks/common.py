"""Shared benchmark plumbing: timing, the copy ceiling, run metadata, JSON."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
from pathlib import Path

import torch
import triton
import triton.testing

RESULTS_DIR = Path(__file__).parent / "results"


def bench_ms(fn, warmup: int = 25, rep: int = 100) -> float:
    """Median milliseconds per call, CUDA events, L2 flushed before every call (do_bench).

    The flush (a 256 MB memset) also runs ahead of the CPU, so launch overhead of the call
    under test is hidden unless it exceeds the flush: this is GPU time on a cold L2."""
    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of n implementations in which each one directly follows each other one equally often
    (Williams' design): rows of the Latin square 0, 1, n-1, 2, n-2, ... shifted by 0..n-1, and for odd
    n their mirror images as well (2n rounds)."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(x + shift) % n for x in first] for shift in range(n)]
    return rows + ([row[::-1] for row in rows] if n % 2 and n > 1 else [])


def bench_rounds(fns: dict, warmup: int = 5, rep: int = 15) -> dict:
    """Times each function of `fns` (name -> callable) in rounds of balanced order
    (balanced_orders: each follows each other equally often, since what ran just before moves a
    kernel's time by several percent); returns name -> (median round in ms, every round's ms)."""
    names = list(fns)
    times = {name: [] for name in names}
    for order in balanced_orders(len(names)):
        for index in order:
            times[names[index]].append(bench_ms(fns[names[index]], warmup=warmup, rep=rep))
    return {name: (statistics.median(t), t) for name, t in times.items()}


def bench_paired(fns: dict, budget_ms: float = 200.0, max_iters: int = 1000, sleep_us: float = 100.0) -> dict:
    """Times the functions of `fns` (name -> callable) call by call, interleaved: each iteration
    flushes L2 (a 256 MB memset, as do_bench) before each call and times one call of every
    function, in balanced orders (balanced_orders: each function follows each other equally often).
    Slow changes of the GPU's state (the 2-8 us calls of small sizes move by ~0.5 us for tens of
    milliseconds at a time) then hit every function alike, where timing one function after another
    lets them decide the comparison; and no function always follows the same one (with the order
    merely rotated, add + GeLU at 2^16 read 0.993x the seed's kernel, 1.007-1.014x in balanced
    orders in the same process: docs/notes/gelu.md). Returns name -> (median ms,
    (25th, 75th percentile ms), iterations)."""
    names = list(fns)
    cache = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    for fn in fns.values():  # warm up, and estimate the per-call times for the iteration count
        for _ in range(3):
            fn()
    estimate = {name: bench_ms(fns[name], warmup=1, rep=5) for name in names}
    per_iter = sum(estimate.values()) + len(names) * (0.08 + sleep_us / 1e3)  # plus flushes and spins
    rounds = len(balanced_orders(len(names)))
    iters = int(min(max_iters, max(20, budget_ms / per_iter)))
    iters = -(-iters // rounds) * rounds  # whole cycles of the orders
    result = {}
    for name, times in paired_times(fns, iters, sleep_us, cache, balanced=True).items():
        times = sorted(times)
        quantile = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731,B023
        result[name] = (statistics.median(times), (quantile(0.25), quantile(0.75)), iters)
    return result


def paired_times(fns: dict, iters: int, sleep_us: float = 100.0, cache: torch.Tensor | None = None,
                 balanced: bool = False) -> dict:
    """bench_paired's timing loop: name -> the ms of each of `iters` calls, interleaved, each call
    after an L2 flush (a memset of `cache`, 256 MB unless given) with a spin kernel ahead of it.
    Iteration i calls them in the order rotated by i (each function always follows the same one),
    or with `balanced` in the orders of balanced_orders (each follows each other equally often)."""
    names = list(fns)
    orders = balanced_orders(len(names)) if balanced else [
        [(i + k) % len(names) for k in range(len(names))] for i in range(len(names))]
    if cache is None:
        cache = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    events = {name: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(iters)] for name in names}
    # A spin kernel ahead of each flush keeps the GPU busy while the host prepares the call, so
    # one function's host overhead (torch.compile's wrapper: ~100 us) neither reaches its own
    # time nor drains the queue ahead of the next function's.
    clock_khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 1_980_000)  # H200 boost clock
    spin = int(sleep_us * clock_khz / 1e3)
    for i in range(iters):
        for index in orders[i % len(orders)]:
            name = names[index]
            torch.cuda._sleep(spin)
            cache.zero_()
            start, end = events[name][i]
            start.record()
            fns[name]()
            end.record()
    torch.cuda.synchronize()
    return {name: [start.elapsed_time(end) for start, end in events[name]] for name in names}


def copy_fn(nbytes_moved: int, dtype=torch.uint8):
    """A device-to-device copy moving `nbytes_moved` (bytes read + written): (call, bytes moved)."""
    elems = max(1, nbytes_moved // 2 // torch.tensor([], dtype=dtype).element_size())
    src = torch.randn(elems, device="cuda").to(dtype) if dtype.is_floating_point else torch.randint(0, 255, (elems,), device="cuda", dtype=dtype)
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2 * src.numel() * src.element_size()


def copy_gbps(nbytes_moved: int, dtype=torch.uint8) -> float:
    """Device-to-device copy bandwidth (bytes read + written) for a copy moving `nbytes_moved`."""
    fn, moved = copy_fn(nbytes_moved, dtype)
    return moved / bench_ms(fn) / 1e6


def git_commit() -> str:
    commit = os.environ.get("FLASHEXT_GIT_COMMIT")
    if commit:
        return commit
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except Exception:
        return "unknown"


def gpu_state() -> dict:
    """The GPU's clocks, temperature, power and clock-event (throttle) reasons now (nvidia-smi), so
    that a run's figures can be read against the state it ran in (a sustained load may lower the SM
    clock, which moves issue-bound kernels and not memory-bound anchors); {} without nvidia-smi."""
    base = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw")
    for fields in (base + ("clocks_event_reasons.active",), base + ("clocks_throttle_reasons.active",), base):
        try:  # (the reasons field's name depends on the driver: the first query it knows answers)
            line = subprocess.check_output(
                ["nvidia-smi", "-i", "0", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                text=True, stderr=subprocess.DEVNULL, timeout=10).strip().splitlines()[0]
        except Exception:
            continue
        return dict(zip(fields, (value.strip() for value in line.split(","))))
    return {}


def run_metadata() -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu_state_start": gpu_state(),  # (and gpu_state_end, added by write_json)
        # build variant of an A/B run (e.g. a branch under test): "name: what differs"
        **({"variant": os.environ["FLASHEXT_BENCH_VARIANT"]} if os.environ.get("FLASHEXT_BENCH_VARIANT") else {}),
    }


def output_dir() -> Path:
    """$OUT when set (the GPU machine's return folder), else benchmarks/results."""
    out = os.environ.get("OUT")
    path = Path(out) if out else RESULTS_DIR
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(name: str, payload: dict) -> Path:
    if isinstance(payload.get("meta"), dict) and "gpu_state_start" in payload["meta"]:
        payload["meta"]["gpu_state_end"] = gpu_state()
    path = output_dir() / name
    path.write_text(json.dumps(payload, indent=1))
    return path


def parse_args(description: str, default_sections: str, quick_help: str, plot, summarize):
    """The benchmarks' command line: --quick, --only SECTIONS, --replot JSON. With --replot the
    PNG beside the JSON is redrawn with `plot`, its summary reprinted, and None returned."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--only", default=default_sections)
    parser.add_argument("--replot", metavar="JSON", help="redraw the PNG beside a results JSON and reprint its summary")
    args = parser.parse_args()
    if args.replot:
        payload = json.loads(Path(args.replot).read_text())
        plot(payload, Path(args.replot).with_suffix(".png"))
        summarize(payload)
        return None
    return args
