"""A model of the Hopper forward's mbarrier protocol (csrc/kernels/attention/flash_fwd_sm90.cu),
to check a change of its waits and releases before a GPU runs it.

    python3 benchmarks/experiments/sm90_fwd_barrier_model.py [SEED] [RUNS_PER_BLOCK_COUNT] [RANDOM_RUNS]

One producer thread (Q, then K of block b and V of block b - 1, each load waiting for its stage's
release) and C consumer warpgroups of 4 warps: per-warp full-barrier waits, a wgmma that starts
once all 4 warps issued it, commit groups retiring in order, releases by warp 0 of the warpgroup,
TMA landing at random times, sometimes one warp lagging. Per configuration (K and V stage counts,
Q buffers, consumer warpgroups; the key loop as at e60821c ("head"), with V's wait after S's issue
("serial": the kernel since e2b1bd9 at D <= 128), and with the deep pipeline of the rejected
sm90_fwd_deep.patch, in the tree at 10ded41), with V's wait before S's issue ("v_first": D = 256
since 8771a42), and with the two consumer warpgroups' ping-pong turns on named barriers 1 and 2
(kPingPong, D = 128 since 611f595; the varlen guard's barrier 3 of all consumer warps before the
last P V modelled too), and with O written through the last block's stages (D = 256 since d2b2ba5:
warpgroup 0 keeps K's stage, 1 V's, until its O store has read it; named barriers 7 and 8
hand the stages over) it runs
tiles of 1-5 blocks and random runs of tiles, and reports deadlocks, a wgmma reading a buffer that
does not (yet) hold the use it expects, a load overwriting a buffer a running wgmma reads, an O
write into a stage that a wgmma still reads or a load has refilled, and a release before its
readers retired or a barrier left with partial arrivals. As a check of the
model, the known hang (a warpgroup releasing right after a bare wait, with no wgmma between:
docs/notes/attention_sm90_fwd.md, "Per-warpgroup key ranges, and a hang") must show up."""
import random
import sys


class Bar:
    def __init__(self, count):
        self.count = count
        self.pending = count
        self.tx_armed = False
        self.phase = 0  # number of completed phases

    def arrive(self):
        self.pending -= 1
        assert self.pending >= 0, "too many arrivals"
        if self.pending == 0:
            self.phase += 1
            self.pending = self.count

    def done(self, parity):  # try_wait.parity: the phase of that parity has completed
        return (self.phase & 1) != parity


class Fail(Exception):
    pass


def tile_uses(tiles):
    """Each tile that has blocks, with the Q loads and K / V blocks before it on the CTA (the
    producer and the consumers count them alike; a tile of no block loads nothing)."""
    q_uses = kv = 0
    for n in tiles:
        if n:
            yield n, q_uses, kv
            q_uses += 1
            kv += n


def consumer_program(tiles, SK, SV, kQ, deep_on, variant, pingpong=False, c=0, o_in_stage=False):
    """Ops for one warp of consumer warpgroup c (the same for every warp; warp 0 also does the
    releases). With pingpong, warpgroup c syncs on named barrier 1 + c before a turn's GEMMs and
    arrives on the other's after; warpgroup 1 arrives once first, warpgroup 0 syncs once last."""
    ops = []
    mine, yours = ("nb", 1 + c), ("nb", 2 - c)
    turn = lambda: ops.extend([("nb_arrive", mine[1]), ("nb_wait", mine[1])]) if pingpong else None
    hand = lambda: ops.append(("nb_arrive", yours[1])) if pingpong else None
    if pingpong and c == 1:
        ops.append(("nb_arrive", 1))
    for n, q_uses, kv in tile_uses(tiles):
        qs = q_uses % kQ
        Q = ("Q", qs, q_uses)
        K = lambda b: ("K", (kv + b) % SK, kv + b)
        V = lambda b: ("V", (kv + b) % SV, kv + b)
        full_par = lambda r: (r[2] // {"Q": kQ, "K": SK, "V": SV}[r[0]]) & 1
        W = lambda r: ops.append(("wait", r, full_par(r)))
        I = lambda reads, tag: ops.append(("issue", tuple(reads), tag))
        G = lambda k: ops.append(("waitg", k))
        kept = {K(n - 1)} if (o_in_stage and c == 0) else {V(n - 1)} if (o_in_stage and c == 1) else set()
        R = lambda r: None if r in kept else ops.append(("rel", r))
        W(Q)
        if variant == "bare_wait_release":  # the hang's pattern: stages released after a bare wait
            W(K(0)); R(K(0))
            if n == 1: R(Q)
            for it in range(1, n):
                W(K(it)); W(V(it - 1)); R(K(it))
                if it == n - 1: R(Q)
                R(V(it - 1))
            W(V(n - 1)); R(V(n - 1))
            continue
        if deep_on and n > 1:
            W(K(0)); I([Q, K(0)], "S0")
            W(K(1)); I([Q, K(1)], "S1")
            G(1)
            R(K(0))
            G(0)
            R(K(1))
            if n == 2:
                R(Q)
            for it in range(1, n):
                more = it < n - 1
                W(V(it - 1)); I([V(it - 1)], "PV%d" % (it - 1))
                if more:
                    W(K(it + 1)); I([Q, K(it + 1)], "S%d" % (it + 1))
                G(0)
                R(V(it - 1))
                if more:
                    R(K(it + 1))
                    if it + 1 == n - 1:
                        R(Q)
        else:
            W(K(0)); turn(); I([Q, K(0)], "S0"); hand()
            G(0)
            R(K(0))
            if n == 1:
                R(Q)
            for it in range(1, n):
                if variant in ("head", "v_first"):
                    W(K(it)); W(V(it - 1)); turn(); I([Q, K(it)], "S%d" % it); I([V(it - 1)], "PV%d" % (it - 1))
                else:  # loop_serial: V's wait after S's issue
                    W(K(it)); turn(); I([Q, K(it)], "S%d" % it); W(V(it - 1)); I([V(it - 1)], "PV%d" % (it - 1))
                hand()
                G(1)
                R(K(it))
                if it == n - 1:
                    R(Q)
                G(0)
                R(V(it - 1))
        if o_in_stage and c == 1:  # its last S has retired
            ops.append(("nb_arrive", 7))
        W(V(n - 1))
        if pingpong:  # the varlen guard's barrier of every consumer warp (a superset: dense calls skip it)
            ops.extend([("nb_arrive", 3), ("nb_wait", 3)])
        turn(); I([V(n - 1)], "PV%d" % (n - 1)); hand(); G(0); R(V(n - 1))
        if o_in_stage:  # the epilogue: O through the kept stage, then its release
            if c == 0:
                ops.extend([("nb_arrive", 7), ("nb_wait", 7), ("nb_arrive", 8)])
            else:
                ops.extend([("nb_arrive", 8), ("nb_wait", 8)])
            (buf,) = kept
            # every warp's part written (named barrier 4 + c, the warpgroup's own), then the store
            # (its read waited for by the issuing thread) and the release
            ops.extend([("owrite", buf), ("nb_arrive", 4 + c), ("nb_wait", 4 + c), ("rel", buf)])
    if pingpong and c == 0:
        ops.extend([("nb_arrive", 1), ("nb_wait", 1)])
    return ops


def producer_program(tiles, SK, SV, kQ):
    ops = []
    for n, q_uses, kv in tile_uses(tiles):
        qs = q_uses % kQ
        if q_uses >= kQ:
            ops.append(("wait_empty", ("Q", qs), ((q_uses // kQ) & 1) ^ 1))
        ops.append(("load", ("Q", qs, q_uses)))

        def load(kind, S, b):
            g = kv + b
            st = g % S
            if g >= S:
                ops.append(("wait_empty", (kind, st), ((g // S) & 1) ^ 1))
            ops.append(("load", (kind, st, g)))

        load("K", SK, 0)
        for b in range(1, n + 1):
            if b < n:
                load("K", SK, b)
            load("V", SV, b - 1)
    return ops


def run(tiles, SK, SV, kQ, C, deep_on, variant, rng, max_steps=200000, pingpong=False, o_in_stage=False):
    # named barriers, counted in warps: 1 and 2 the ping-pong's (both warpgroups), 3 all consumers,
    # 4 and 5 each warpgroup's own, 7 and 8 the O-in-stage hand-overs (both warpgroups)
    named = {i: {"count": 4 * C if i == 3 else 4 if i in (4, 5) else 8, "arrived": 0, "gen": 0} for i in (1, 2, 3, 4, 5, 7, 8)}
    arrived_gen = {}  # (c, w, id) -> the barrier's generation when that warp last arrived
    full = {}
    empty = {}
    for kind, S in (("Q", kQ), ("K", SK), ("V", SV)):
        for s in range(S):
            full[(kind, s)] = Bar(1)
            empty[(kind, s)] = Bar(C)
    content = {}  # buffer -> (use, landed)
    prod = producer_program(tiles, SK, SV, kQ)
    cons_wg = [consumer_program(tiles, SK, SV, kQ, deep_on, "bare_wait_release" if (variant == "bare_wait_release" and c == C - 1) else variant, pingpong, c, o_in_stage) for c in range(C)]
    pc_p = 0
    pending_tma = []  # (buffer, use)
    pc = [[0] * 4 for _ in range(C)]
    issued = [[0] * 4 for _ in range(C)]  # groups issued by each warp
    groups = [[] for _ in range(C)]  # per warpgroup: list of [reads, started, retired, issuers]
    retired = [0] * C
    n_started = [0] * C

    def buffer_readers(buf):
        for c in range(C):
            for g in groups[c][retired[c]:]:
                if g["started"] and any((r[0], r[1]) == buf for r in g["reads"]):
                    return True
        return False

    slow = (rng.randrange(C), rng.randrange(4)) if rng.random() < 0.5 else None
    steps = 0
    while True:
        steps += 1
        if steps > max_steps:
            raise Fail("step limit")
        cands = []
        # producer
        if pc_p < len(prod):
            op = prod[pc_p]
            if op[0] == "wait_empty":
                if empty[op[1]].done(op[2]):
                    cands.append(("p",))
            else:
                cands.append(("p",))
        for i in range(len(pending_tma)):
            cands.append(("tma", i))
        for c in range(C):
            # retire the oldest started group
            cons = cons_wg[c]
            if retired[c] < len(groups[c]) and groups[c][retired[c]]["started"]:
                cands.append(("retire", c))
            for w in range(4):
                if pc[c][w] >= len(cons):
                    continue
                op = cons[pc[c][w]]
                if op[0] == "wait":
                    r = op[1]
                    if full[(r[0], r[1])].done(op[2]):
                        cands.append(("w", c, w))
                elif op[0] == "waitg":
                    if issued[c][w] - retired[c] <= op[1]:
                        cands.append(("w", c, w))
                elif op[0] == "nb_wait":
                    if named[op[1]]["gen"] > arrived_gen[(c, w, op[1])]:
                        cands.append(("w", c, w))
                else:
                    cands.append(("w", c, w))
        if not cands:
            done = pc_p >= len(prod) and all(pc[c][w] >= len(cons_wg[c]) for c in range(C) for w in range(4))
            if done and not pending_tma and all(retired[c] == len(groups[c]) for c in range(C)):
                # every barrier must end with no partial arrivals
                for key, b in empty.items():
                    if b.pending != b.count:
                        raise Fail("empty barrier %s left with partial arrivals" % (key,))
                for i, b in named.items():
                    if b["arrived"]:
                        raise Fail("named barrier %d left with %d warps arrived" % (i, b["arrived"]))
                return steps
            state = {"producer": prod[pc_p] if pc_p < len(prod) else None,
                     "consumers": [[cons_wg[c][pc[c][w]] if pc[c][w] < len(cons_wg[c]) else None for w in range(4)] for c in range(C)]}
            raise Fail("deadlock: %s" % state)
        if slow is not None and len(cands) > 1 and rng.random() > 0.02:
            others = [x for x in cands if not (x[0] == "w" and (x[1], x[2]) == slow)]
            a = rng.choice(others) if others else rng.choice(cands)
        else:
            a = rng.choice(cands)
        if a[0] == "p":
            op = prod[pc_p]
            pc_p += 1
            if op[0] == "load":
                kind, st, use = op[1]
                buf = (kind, st)
                if buffer_readers(buf):
                    raise Fail("TMA overwrites %s (use %d) while a wgmma reads it" % (buf, use))
                content[buf] = (use, False)
                full[buf].tx_armed = True
                pending_tma.append((buf, use))
        elif a[0] == "tma":
            buf, use = pending_tma.pop(a[1])
            content[buf] = (use, True)
            full[buf].arrive()
        elif a[0] == "retire":
            c = a[1]
            groups[c][retired[c]]["retired"] = True
            retired[c] += 1
        else:
            _, c, w = a
            op = cons_wg[c][pc[c][w]]
            pc[c][w] += 1
            if op[0] == "nb_arrive":
                b = named[op[1]]
                arrived_gen[(c, w, op[1])] = b["gen"]
                b["arrived"] += 1
                if b["arrived"] == b["count"]:
                    b["gen"] += 1
                    b["arrived"] = 0
            elif op[0] == "issue":
                gi = issued[c][w]
                issued[c][w] += 1
                while len(groups[c]) <= gi:
                    groups[c].append({"reads": op[1], "started": False, "retired": False, "issuers": 0, "tag": op[2]})
                g = groups[c][gi]
                assert g["tag"] == op[2]
                g["issuers"] += 1
                if g["issuers"] == 4:
                    g["started"] = True
                    for r in g["reads"]:
                        got = content.get((r[0], r[1]))
                        if got != (r[2], True):
                            raise Fail("wgmma %s of wg %d reads %s expecting use %d, holds %s" % (op[2], c, (r[0], r[1]), r[2], got))
            elif op[0] == "owrite":
                r = op[1]
                if content.get((r[0], r[1])) != (r[2], True):
                    raise Fail("wg %d writes O into %s (use %d), which holds %s" % (c, (r[0], r[1]), r[2], content.get((r[0], r[1]))))
                if buffer_readers((r[0], r[1])):
                    raise Fail("wg %d writes O into %s while a wgmma reads it" % (c, (r[0], r[1])))
            elif op[0] == "rel":
                if w == 0:
                    r = op[1]
                    # every wgmma reading this use must have retired
                    for g in groups[c]:
                        if not g["retired"] and any(x == r for x in g["reads"]):
                            raise Fail("release of %s by wg %d before its reader %s retired" % (r, c, g["tag"]))
                    empty[(r[0], r[1])].arrive()


def main():
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    rng = random.Random(seed)
    results = {}
    configs = []
    for deep_on in (True, False):
        for variant in ("serial", "head", "v_first"):
            if deep_on and variant != "serial":
                continue
            for SK, SV in ((2, 2), (4, 4), (2, 3), (3, 3), (3, 2)):
                for kQ in (1, 2):
                    for C in (2, 3):
                        for pingpong in (False, True):
                            if pingpong and (deep_on or C != 2 or variant == "head"):
                                continue
                            configs.append((deep_on, variant, SK, SV, kQ, C, pingpong, False))
                        if not deep_on and variant in ("serial", "v_first") and C == 2:
                            configs.append((deep_on, variant, SK, SV, kQ, C, False, True))
    for cfg in configs:
        deep_on, variant, SK, SV, kQ, C, pingpong, o_in_stage = cfg
        fails = 0
        runs = 0
        for n in (1, 2, 3, 4, 5):
            for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 40):
                runs += 1
                try:
                    run([n] * 3, SK, SV, kQ, C, deep_on, variant, rng, pingpong=pingpong, o_in_stage=o_in_stage)
                except Fail as e:
                    fails += 1
                    if fails <= 2:
                        print("FAIL", cfg, [n] * 3, e)
        for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 300):
            tiles = [rng.choice([0, 1, 1, 2, 2, 3, 4, 5, 6, 7]) for _ in range(rng.randint(1, 6))]
            runs += 1
            try:
                run(tiles, SK, SV, kQ, C, deep_on, variant, rng, pingpong=pingpong, o_in_stage=o_in_stage)
            except Fail as e:
                fails += 1
                if fails <= 2:
                    print("FAIL", cfg, tiles, e)
        results[cfg] = (runs, fails)
    for cfg, (runs, fails) in results.items():
        print(cfg, runs, "runs,", fails, "failures")
    # sanity: the model must find the known bug (a release after a bare wait)
    bad = 0
    for _ in range(2000):
        tiles = [rng.choice([1, 2, 3]) for _ in range(6)]
        try:
            run(tiles, 2, 2, 2, 2, False, "bare_wait_release", rng)
        except Fail as e:
            bad += 1
            if bad == 1:
                print("release after a bare wait (expected to fail):", str(e)[:300])
    print("release after a bare wait: failures in", bad, "of 2000 runs (must be > 0)")
    return 0 if bad and not any(f for _, f in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
