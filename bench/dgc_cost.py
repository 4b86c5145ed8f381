#!/usr/bin/env python3
"""dgc_cost.py - the alpha-beta cost model of DGC's exchange (issue 18; docs/dgc.md).

Per exchange, N workers, k pairs of 8 bytes per worker, alpha seconds per message round, beta
seconds per byte on each worker's link (full duplex), gamma seconds of local work per pair:

  allgather (ring)     (N - 1) alpha + 8 k (N - 1) beta
  sparse allreduce     (4 (N - 1) + 3 ceil(log2 N)) alpha              two alltoallv, the
                       + 8 (N - 1)/N (k + min(U, B k)) beta            kept-count allgather and
                       + [U > B k] 2 * 2 KiB ceil(log2 N) beta         allgatherv (N - 1 rounds
                       + gamma k max(1, N / cores)                     each), three small
                                                                       allreduces (log2 N)
  dense allreduce      2 (N - 1) alpha + 8 n (N - 1)/N beta            (ring)

U = min(n, f k + N (1 - f) k) is the number of distinct indices when a fraction f of every
worker's indices is common to all; B = 4 is DGC's budget (src/strategy/dgc_math.h). gamma is
the sparse allreduce's own work (sorting, summing, the threshold), measured with one worker;
when N workers share `cores` cores (netlab on one machine) it is paid N / cores times over.

  dgc_cost.py validate RAW [--cores 2] [--shared 0.5] [--budget 4]
      RAW: bench/dgc_exchange.sh's RAW file. alpha per N from the 8-byte allgather rows
      (time / (N - 1): on one machine this is mostly the wake-up of N processes on few cores),
      beta from the dense allreduce of the fewest hosts, gamma from the one-worker sparse rows.
      Prints measured against predicted for every allgather and sparse row, and the error.
  dgc_cost.py predict [--alpha-us 50] [--gamma-ns 30] [--compute-s 0.1] [--params 25557032]
                      [--dense-params 53120] [--sparsity 0.999] [--shared 0.5] [--budget 4]
      ResNet-50's step (compute-s of computation, then the exchange, no overlap) with dense
      allreduce, allgather-DGC and sparse-allreduce DGC for 16 .. 1024 workers at 1 and
      10 Gbit/s (beta from 0.956 x the rate: TCP's goodput over Ethernet frames), as a ratio
      to the computation alone; the small tensors DGC keeps dense (dense-params values) are
      allreduced by recursive doubling in every DGC row.
"""
import argparse
import math
import statistics
import sys

HIST = 2 * 2048  # two 256-bin histograms of 8-byte counts


def rounds_sparse(n):
    return 4 * (n - 1) + 3 * math.ceil(math.log2(n)) if n > 1 else 0


def union(n, k, numel, shared):
    return min(numel, shared * k + n * (1 - shared) * k)


def t_allgather(n, k, a, b):
    return (n - 1) * a + 8 * k * (n - 1) * b


def t_sparse(n, k, numel, a, b, g, shared, budget, cores):
    if n == 1:
        return g * k
    u = union(n, k, numel, shared)
    kept = min(u, budget * k)
    t = rounds_sparse(n) * a + 8 * (n - 1) / n * (k + kept) * b
    if u > budget * k:
        t += HIST * math.ceil(math.log2(n)) * b
    return t + g * k * max(1.0, n / cores)


def t_dense(n, numel, a, b):
    return 2 * (n - 1) * a + 8 * numel * (n - 1) / n * b if n > 1 else 0


def t_small(n, numel, a, b):  # recursive doubling of a small buffer
    r = math.ceil(math.log2(n)) if n > 1 else 0
    return 2 * r * a + 4 * numel * r * b


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
    alpha = {h: t / (h - 1) for (op, h, k, n), (t, _, _) in m.items() if op == "latency" and h > 1}
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
            u = union(h, k, n, args.shared)
            pb = 8 * (h - 1) / h * (k + min(u, args.budget * k)) + (
                HIST * math.ceil(math.log2(h)) if u > args.budget * k else 0)
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
            small = t_small(n, args.dense_params, a, b)
            dense = tc + t_dense(n, args.params, a, b)
            ag = tc + t_allgather(n, k, a, b) + small
            sp = tc + t_sparse(n, k, n_c, a, b, g, args.shared, args.budget, 1e9) + small
            mb = 8 * (n - 1) / n * (k + min(union(n, k, n_c, args.shared), args.budget * k)) / 1e6
            print(f"| {gbit} Gbit/s | {n} | {dense / tc:.2f} | {ag / tc:.2f} | {sp / tc:.2f} | "
                  f"{mb:.2f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate")
    v.add_argument("raw")
    v.add_argument("--cores", type=float, default=2)
    v.add_argument("--shared", type=float, default=0.5)
    v.add_argument("--budget", type=float, default=4)
    q = sub.add_parser("predict")
    q.add_argument("--alpha-us", type=float, default=50)
    q.add_argument("--gamma-ns", type=float, default=30)
    q.add_argument("--compute-s", type=float, default=0.1)
    q.add_argument("--params", type=int, default=25557032)
    q.add_argument("--dense-params", type=int, default=53120)
    q.add_argument("--sparsity", type=float, default=0.999)
    q.add_argument("--shared", type=float, default=0.5)
    q.add_argument("--budget", type=float, default=4)
    args = p.parse_args()
    validate(args) if args.cmd == "validate" else predict(args)


if __name__ == "__main__":
    main()
