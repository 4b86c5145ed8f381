#!/usr/bin/env python3
"""dgc_cost.py - the alpha-beta cost model of DGC's exchange (issue 18; docs/dgc.md).

Per exchange, N workers, k pairs of 8 bytes per worker, alpha seconds per message round, beta
seconds per byte on each worker's link (full duplex), gamma seconds of local work per pair:

  allgather            g(8 k N) alpha + 8 k (N - 1) beta              g(B): Bruck's ceil(log2 N)
                                                                       rounds up to 1 MiB
                                                                       gathered or 256 KiB per
                                                                       round saved, the ring's
                                                                       N - 1 above (tcp's choice)
  sparse allreduce     ((N - 1) + 2 ceil(log2 N) + g(8 K) + h rd(N)) alpha
                       + 8 (N - 1)/N (k + K) beta
                       + 8 ceil(N/2) ceil(log2 N) beta
                       + (2056 + [U > B k] 2048) rd(N) beta
                       + gamma k max(1, N / cores)
      K = min(U, B k) sums kept; h = 2 histogram allreduces when U > B k, else 1. Rounds: the
      pairs' alltoallv is pairwise (N - 1); Bruck's alltoall of the counts and allgather of
      the kept counts (ceil(log2 N) each), the allgatherv of the kept sums (g); the histograms
      (the first also carries the count of distinct indices) by recursive doubling (rd(N)).
  dense allreduce      as the tcp backend picks it for n values: recursive doubling
                       rd(N) (alpha + 4 n beta) up to 256 KiB (from 64 KiB on, with 8 or more
                       ranks, Rabenseifner's 2 log2 N alpha + 8 n (N - 1)/N beta, up to 4 MiB),
                       else the ring 2 (N - 1) alpha + 8 n (N - 1)/N beta

rd(N) = log2 N for powers of two, floor(log2 N) + 2 otherwise (the fold).
U = min(n, f k + N (1 - f) k) is the number of distinct indices when a fraction f of every
worker's indices is common to all; B = 7 is DGC's default budget (src/strategy/dgc_math.h).
gamma is the sparse allreduce's own work (sorting, summing, the threshold), measured with one worker;
when N workers share `cores` cores (netlab on one machine) it is paid N / cores times over.

  dgc_cost.py validate RAW [--cores 2] [--shared 0.5] [--budget 7]
      RAW: bench/dgc_exchange.sh's RAW file. alpha per N from the 8-byte allgather rows
      (time / g(8 N) rounds: on one machine mostly the wake-up of N processes on few cores),
      beta from the dense allreduce of the fewest hosts, gamma from the one-worker sparse rows.
      Prints measured against predicted for every allgather and sparse row, and the error.
  dgc_cost.py predict [--alpha-us 50] [--gamma-ns 30] [--compute-s 0.1] [--params 25557032]
                      [--dense-params 53120] [--sparsity 0.999] [--shared 0.5] [--budget 7]
      ResNet-50's step (compute-s of computation, then the exchange, no overlap) with dense
      allreduce, allgather-DGC and sparse-allreduce DGC for 16 .. 1024 workers at 1 and
      10 Gbit/s (beta from 0.956 x the rate: TCP's goodput over Ethernet frames), as a ratio
      to the computation alone; the small tensors DGC keeps dense (dense-params values) are
      allreduced as the tcp backend picks (t_dense) in every DGC row.
"""
import argparse
import math
import statistics
import sys

HIST1 = 257 * 8   # the count of distinct indices and the exponent histogram
HIST2 = 256 * 8   # the next 8 bits' histogram, when the budget binds
BRUCK_MAX = 1 << 20   # the tcp backend's switch from Bruck's allgather to the ring ...
BRUCK_ROUND = 256 << 10   # ... or this many bytes per round Bruck saves (fl_tcp_gather_bruck)
RD_MAX, RH_MIN, RH_MAX, RH_RANKS = 256 << 10, 64 << 10, 4 << 20, 8   # tcp's allreduce choice


def lg(n):
    return math.ceil(math.log2(n)) if n > 1 else 0


def rd_rounds(n):
    f = int(math.floor(math.log2(n))) if n > 1 else 0
    return f if (1 << f) == n else f + 2


def union(n, k, numel, shared):
    return min(numel, shared * k + n * (1 - shared) * k)


def sparse_rounds_bytes(n, k, numel, shared, budget):
    """message rounds and bytes received per worker of one sparse allreduce"""
    u = union(n, k, numel, shared)
    kept = min(u, budget * k)
    over = u > budget * k
    rounds = (n - 1) + 2 * lg(n) + gather_rounds(n, 8 * kept) + rd_rounds(n) * (2 if over else 1)
    nbytes = (8 * (n - 1) / n * (k + kept) + 8 * math.ceil(n / 2) * lg(n)
              + (HIST1 + (HIST2 if over else 0)) * rd_rounds(n))
    return rounds, nbytes


def gather_rounds(n, nbytes):
    """tcp over sockets: Bruck's allgather up to BRUCK_MAX gathered or BRUCK_ROUND per round
    it saves against the ring (n - 1 - lg n), else the ring"""
    saved = n - 1 - lg(n)
    return lg(n) if nbytes <= BRUCK_MAX or nbytes <= saved * BRUCK_ROUND else n - 1


def t_allgather(n, k, a, b):
    return gather_rounds(n, 8 * k * n) * a + 8 * k * (n - 1) * b


def t_sparse(n, k, numel, a, b, g, shared, budget, cores):
    if n == 1:
        return g * k
    rounds, nbytes = sparse_rounds_bytes(n, k, numel, shared, budget)
    return rounds * a + nbytes * b + g * k * max(1.0, n / cores)


def t_dense(n, numel, a, b):
    """the tcp backend's allreduce of numel f32 values (src/comm/tcp.c's choice)"""
    if n <= 1:
        return 0
    nb = 4 * numel
    if nb <= RD_MAX and not (n >= RH_RANKS and nb >= RH_MIN):
        return rd_rounds(n) * (a + nb * b)
    if n >= RH_RANKS and RH_MIN <= nb <= RH_MAX:
        return 2 * lg(n) * a + 2 * nb * (n - 1) / n * b
    return 2 * (n - 1) * a + 2 * nb * (n - 1) / n * b


def read_raw(path):
    rows = {}
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            op, hosts, k, numel, ms, recv, dropped = line.split()[:7]
            key = (op, int(hosts), int(k), int(numel))
            rows.setdefault(key, []).append((float(ms) / 1e3, float(recv), float(dropped)))
    return {key: tuple(statistics.median(v[i] for v in vals) for i in range(3))
            for key, vals in rows.items()}


def validate(args):
    m = read_raw(args.raw)
    alpha = {h: t / gather_rounds(h, 8 * h)
             for (op, h, k, n), (t, _, _) in m.items() if op == "latency" and h > 1}
    dense = sorted((h, n, t) for (op, h, k, n), (t, _, _) in m.items() if op == "dense" and h > 1)
    if not alpha or not dense:
        sys.exit("dgc_cost.py: RAW needs latency and dense rows")
    h, n, t = dense[0]
    beta = (t - 2 * (h - 1) * alpha[h]) / (8 * n * (h - 1) / h)
    gamma = {k: t / k for (op, h1, k, n1), (t, _, _) in m.items() if op == "sparse" and h1 == 1}
    print(f"# fitted: beta {beta * 1e9:.3f} ns/byte ({8 / beta / 1e9:.3f} Gbit/s, from the dense "
          f"allreduce of {n} values on {h} hosts); alpha per round "
          + ", ".join(f"N={h}: {a * 1e6:.0f} us" for h, a in sorted(alpha.items()))
          + "; gamma " + ", ".join(f"k={k}: {g * 1e9:.1f} ns/pair" for k, g in sorted(gamma.items())))
    print("| op | hosts | k | measured ms | predicted ms | error | measured KB | predicted KB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    worst = 0.0
    for (op, h, k, n), (t, recv, _) in sorted(m.items(), key=lambda x: (x[0][2], x[0][0], x[0][1])):
        if op not in ("allgather", "sparse") or h == 1 or h not in alpha:
            continue
        a = alpha[h]
        g = gamma.get(k, statistics.median(gamma.values()) if gamma else 0.0)
        if op == "allgather":
            p, pb = t_allgather(h, k, a, beta), 8 * k * (h - 1)
        else:
            p = t_sparse(h, k, n, a, beta, g, args.shared, args.budget, args.cores)
            pb = sparse_rounds_bytes(h, k, n, args.shared, args.budget)[1]
        err = (p - t) / t
        worst = max(worst, abs(err))
        print(f"| {op} | {h} | {k} | {t * 1e3:.2f} | {p * 1e3:.2f} | {100 * err:+.1f}% | "
              f"{recv / 1e3:.1f} | {pb / 1e3:.1f} |")
    print(f"# largest error {100 * worst:.1f}%")


def predict(args):
    a, g, tc = args.alpha_us * 1e-6, args.gamma_ns * 1e-9, args.compute_s
    n_c = args.params - args.dense_params
    k = math.ceil(n_c * (1 - args.sparsity))
    print(f"# ResNet-50: {args.params} values ({n_c} compressed, k = {k} pairs per worker at "
          f"sparsity {args.sparsity}), computation {tc} s per step, alpha {args.alpha_us} us, "
          f"gamma {args.gamma_ns} ns/pair, shared fraction {args.shared}, budget {args.budget} k")
    print("| link | workers | dense | allgather-DGC | sparse-allreduce DGC | sparse: MB received |")
    print("| --- | --- | --- | --- | --- | --- |")
    for gbit in (1, 10):
        b = 8 / (0.956 * gbit * 1e9)
        for n in (8, 16, 32, 64, 128, 256, 512, 1024):
            small = t_dense(n, args.dense_params, a, b)
            dense = tc + t_dense(n, args.params, a, b)
            ag = tc + t_allgather(n, k, a, b) + small
            sp = tc + t_sparse(n, k, n_c, a, b, g, args.shared, args.budget, 1e9) + small
            mb = sparse_rounds_bytes(n, k, n_c, args.shared, args.budget)[1] / 1e6
            print(f"| {gbit} Gbit/s | {n} | {dense / tc:.2f} | {ag / tc:.2f} | {sp / tc:.2f} | "
                  f"{mb:.2f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate")
    v.add_argument("raw")
    v.add_argument("--cores", type=float, default=2)
    v.add_argument("--shared", type=float, default=0.5)
    v.add_argument("--budget", type=float, default=7)
    q = sub.add_parser("predict")
    q.add_argument("--alpha-us", type=float, default=50)
    q.add_argument("--gamma-ns", type=float, default=30)
    q.add_argument("--compute-s", type=float, default=0.1)
    q.add_argument("--params", type=int, default=25557032)
    q.add_argument("--dense-params", type=int, default=53120)
    q.add_argument("--sparsity", type=float, default=0.999)
    q.add_argument("--shared", type=float, default=0.5)
    q.add_argument("--budget", type=float, default=7)
    args = p.parse_args()
    validate(args) if args.cmd == "validate" else predict(args)


if __name__ == "__main__":
    main()
