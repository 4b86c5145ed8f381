#!/usr/bin/python3
"""gloo_allreduce.py - torch.distributed allreduce (gloo backend, f32 sum, in place) timed the way
fleet-commbench times fleet's allreduce, as a reference for bench/allreduce_peers.sh.

One process per rank, started by a driver with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE in
the environment (init_process_group("gloo"), env:// rendezvous):

    /usr/bin/python3 bench/gloo_allreduce.py [-n ITERS] [-w WARMUP] [-r REPS] SIZE...

SIZE in bytes, with optional suffix K, M, G (2^10, 2^20, 2^30). For each size: WARMUP untimed
allreduces, then REPS repetitions of (barrier; ITERS timed allreduces); a repetition's time is
the mean per allreduce, max over ranks; the size's time is the median over repetitions.
algbw = bytes / time, busbw = algbw x 2(n-1)/n (GB = 1e9 bytes). The buffer holds zeros.
Output (rank 0), the same as bench/mpi_allreduce: comment lines starting with '#', then
    bytes  iters  time_us  algbw_GBps  busbw_GBps
Needs Debian's python3-torch (1.13), importable only by /usr/bin/python3.
"""
import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip()
    if s and s[-1].upper() in mult:
        v = int(s[:-1]) * mult[s[-1].upper()]
    else:
        v = int(s)
    if v <= 0:
        raise argparse.ArgumentTypeError("size must be positive: " + s)
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20, help="timed iterations per repetition")
    ap.add_argument("-w", type=int, default=5, help="untimed warm-up iterations per size")
    ap.add_argument("-r", type=int, default=1, help="repetitions per size (median)")
    ap.add_argument("sizes", nargs="+", type=parse_size)
    a = ap.parse_args()

    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print("# gloo_allreduce: torch %s gloo all_reduce f32 sum in place, %d ranks, "
              "iters %d, warmup %d, reps %d" % (torch.__version__, n, a.n, a.w, a.r))
        print("# %10s %7s %12s %10s %10s" % ("bytes", "iters", "time_us", "algbw_GBps",
                                             "busbw_GBps"))
        sys.stdout.flush()
    tmax = torch.zeros(1, dtype=torch.float64)
    for size in a.sizes:
        count = size // 4
        nbytes = count * 4
        buf = torch.zeros(count, dtype=torch.float32)
        for _ in range(a.w):
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        reps = []
        for _ in range(a.r):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(a.n):
                dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            tmax[0] = (time.perf_counter() - t0) / a.n
            dist.all_reduce(tmax, op=dist.ReduceOp.MAX)
            reps.append(float(tmax[0]))
        t = statistics.median_low(reps)
        algbw = nbytes / t / 1e9
        busbw = algbw * 2.0 * (n - 1) / n
        if rank == 0:
            print("  %10d %7d %12.1f %10.3f %10.3f" % (nbytes, a.n, t * 1e6, algbw, busbw))
            sys.stdout.flush()
        del buf
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
