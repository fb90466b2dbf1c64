"""Plot a Hopper forward or backward trace from probe_sm90.sh with PROBE_TIMELINE=1 (a debugging
tool, not part of the package).

    python benchmarks/experiments/plot_sm90_timeline.py [--kind fwd|bwd] TRACE.bin OUT.png [--cta 0] [--us 40]
    python benchmarks/experiments/plot_sm90_timeline.py --boundary TRACE.bin -   (forward: the tile-end steps)

The trace: 8 CTAs x 4 warpgroups x 8192 slots of (clock64 << 8 | event), then the SM clock in kHz
(the events: sm90_fwd_timeline.patch, sm90_bwd_timeline.patch). One lane per warpgroup of one
CTA: the producer's TMA issues as ticks, each consumer's time split by the event that ends it
(forward: waiting for K / V, issuing, waiting for S, the softmax, waiting for P V, the epilogue;
backward: each step's GEMM issues and waits, P, dS, the barriers, dQ out). Printed: each
consumer's share of time per phase over the whole CTA, tiles and their mean length, and the
median time per key block (forward: between S arrivals inside a tile) or per step (backward).
"""

import argparse
import statistics

import numpy as np

# Per kind: a consumer's time before an event, named by that event; the producer's issue ticks;
# the event that starts a tile and the one that marks a block (forward) or a step (backward).
KINDS = {
    "fwd": {
        "phases": {2: ("wait K / V, rescale", "#bbbbbb"), 3: ("issue", "#ffcc66"), 4: ("wait S", "#6699ff"),
                   5: ("softmax", "#ff6666"), 6: ("wait P V", "#66cc99"), 7: ("after P V", "#dddddd"),
                   9: ("epilogue: sums, lse", "#cc99dd"), 10: ("epilogue: O tile free", "#bb88dd"),
                   11: ("epilogue: stmatrix", "#9966cc"), 12: ("epilogue: fence, barrier", "#774499"),
                   8: ("epilogue: TMA store", "#aa66cc"), 1: ("next tile", "#eeeeee")},
        "marks": {16: ("Q", "v", "#000000"), 17: ("K", "|", "#3355cc"), 18: ("V", "|", "#cc5533")},
        "tile": 1, "block": 4, "block_name": "key block (S to S inside a tile)",
    },
    "bwd": {
        "phases": {1: ("wait K / V", "#eeeeee"), 2: ("wait Q, dO", "#bbbbbb"), 3: ("issue S, dP", "#ffcc66"),
                   4: ("wait S", "#6699ff"), 5: ("P", "#ff6666"), 6: ("issue dV", "#ffcc66"),
                   7: ("wait dP", "#3366cc"), 8: ("dS, to shared", "#ff9999"), 9: ("issue dK", "#ffcc66"),
                   10: ("dS barrier", "#999999"), 11: ("issue dQ", "#ffcc66"), 12: ("wait dV, dK, dQ", "#66cc99"),
                   13: ("dQ out, barrier", "#aa66cc"), 14: ("last add", "#dddddd"), 15: ("dK, dV store", "#884499")},
        "marks": {16: ("K, V", "v", "#000000"), 17: ("Q, dO", "|", "#3355cc")},
        "tile": 1, "block": 2, "block_name": "step (Q, dO ready to the next)",
    },
}


def load(path):
    raw = np.fromfile(path, dtype=np.uint64)
    khz = float(raw[-1])
    data = raw[:-1].reshape(8, 4, 8192)
    return data, khz


def lanes(data, cta):
    out = []
    for wg in range(4):
        row = data[cta, wg]
        row = row[row != 0]
        out.append([(int(v >> np.uint64(8)), int(v & np.uint64(0xFF))) for v in row])
    return out


def boundary(path):
    """The steps of every tile boundary (forward): from the last P V done (event 6) before a tile
    start (1) to that tile's first softmax done (5), each consecutive pair of events a step."""
    data, khz = load(path)
    names = {1: "tile", 2: "K ready", 3: "issued", 4: "S ready", 5: "softmax done", 6: "P V done", 7: "epilogue",
             9: "sums, lse", 10: "O tile free", 11: "stmatrix", 12: "fence, barrier", 8: "TMA store"}
    steps, tiles = {}, []
    for cta in range(data.shape[0]):
        for wg, lane in enumerate(lanes(data, cta)):
            if wg == 0:
                continue
            starts = [i for i, (_, e) in enumerate(lane) if e == 1]
            tiles += [lane[b][0] - lane[a][0] for a, b in zip(starts, starts[1:])]
            for prev, i in zip(starts, starts[1:]):
                # the previous tile's last P V (none: a tile with no key block, left out) and this
                # tile's first softmax
                j = next((k for k in range(i - 1, prev, -1) if lane[k][1] == 6), None)
                m = next((k for k in range(i + 1, len(lane)) if lane[k][1] in (1, 5)), None)
                if j is None or m is None or lane[m][1] != 5:
                    continue
                for (ta, ea), (tb, eb) in zip(lane[j:m], lane[j + 1:m + 1]):
                    steps.setdefault((wg, f"{names.get(ea, ea)} -> {names.get(eb, eb)}"), []).append(tb - ta)
    ns = lambda cycles: cycles / khz * 1e6  # noqa: E731
    print(f"{path}: tile {ns(statistics.median(tiles)) / 1e3:.2f} us (median of {len(tiles)})")
    for (wg, step), values in steps.items():
        print(f"  consumer {wg}: {step:32s} {ns(statistics.median(values)):6.0f} ns (n = {len(values)})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=sorted(KINDS), default="fwd")
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--cta", type=int, default=0)
    ap.add_argument("--us", type=float, default=40.0, help="the plotted window from the CTA's first event, in us")
    ap.add_argument("--boundary", action="store_true",
                    help="forward: print the median of each step from a tile's last P V to the next tile's first "
                    "softmax over CTAs 0-7, per consumer, and stop")
    args = ap.parse_args()
    if args.boundary:
        if args.kind != "fwd":
            ap.error("--boundary: forward traces only")
        boundary(args.trace)
        return
    kind = KINDS[args.kind]
    phases = kind["phases"]
    data, khz = load(args.trace)
    ls = lanes(data, args.cta)
    starts = [lane[0][0] for lane in ls if lane]
    if not starts:
        raise SystemExit("no events for this CTA")
    t0 = min(starts)
    us = lambda cycles: (cycles - t0) / khz * 1e3  # noqa: E731 (cycles at the nominal SM clock)

    shares, tile_lengths, block_times = {}, [], []
    for wg in range(1, 4):
        lane = ls[wg]
        if not lane:
            continue
        totals = {}
        for (ta, _), (tb, eb) in zip(lane, lane[1:]):
            name = phases.get(eb, (str(eb), None))[0]
            totals[name] = totals.get(name, 0) + tb - ta
        span = lane[-1][0] - lane[0][0]
        shares[wg] = {k: v / span for k, v in totals.items()}
        tiles = [t for t, e in lane if e == kind["tile"]]
        tile_lengths += [b - a for a, b in zip(tiles, tiles[1:])]
        last_s = None
        for t, e in lane:
            if e == kind["tile"]:
                last_s = None
            elif e == kind["block"]:
                if last_s is not None:
                    block_times.append(t - last_s)
                last_s = t
    print(f"CTA {args.cta}, SM clock {khz / 1e3:.0f} MHz (nominal)")
    for wg, share in shares.items():
        print(f"  consumer {wg}: " + ", ".join(f"{k} {100 * v:.1f} %" for k, v in sorted(share.items(), key=lambda kv: -kv[1])))
    if tile_lengths:
        print(f"  tiles: {len(tile_lengths)} complete, mean {statistics.mean(tile_lengths) / khz * 1e3:.2f} us")
    if block_times:
        print(f"  {kind['block_name']}: median {statistics.median(block_times) / khz * 1e3:.3f} us")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(14, 3.2))
    seen = set()
    for wg in range(1, 4):
        lane = ls[wg]
        for (ta, _), (tb, eb) in zip(lane, lane[1:]):
            if us(ta) > args.us:
                break
            name, color = phases.get(eb, (str(eb), "#000000"))
            ax.barh(wg, us(tb) - us(ta), left=us(ta), height=0.7, color=color, label=None if name in seen else name)
            seen.add(name)
    marks = kind["marks"]
    for t, e in ls[0]:
        if us(t) > args.us or e not in marks:
            continue
        label, marker, color = marks[e]
        ax.plot(us(t), 0, marker=marker, color=color, markersize=10, label=None if label in seen else f"load {label}")
        seen.add(label)
    ax.set_yticks(range(4), ["producer"] + [f"consumer {c}" for c in range(1, 4)])
    ax.set_ylim(3.6 if ls[3] else 2.6, -0.6)
    ax.set_xlim(0, args.us)
    ax.set_xlabel("us from the CTA's first event (SM cycles at the nominal clock)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=6, fontsize=8)
    what = "forward" if args.kind == "fwd" else "backward"
    ax.set_title(f"Hopper {what}, CTA {args.cta}: {args.trace.split('/')[-1]}")
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()
