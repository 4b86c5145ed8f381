"""ddp_mlp.py - the PyTorch side of bench/ddp_throughput.sh: the MLP of bench/dense_mlp.yaml
trained with torch.nn.parallel.DistributedDataParallel (gloo backend) on random data, as
fleet-train trains it with the dense strategy: float32, softmax cross-entropy, SGD with momentum
0.9, the same local batch, one compute thread.

One process per rank, started with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the
environment (env:// rendezvous; on netlab give GLOO_SOCKET_IFNAME=eth0):

    /usr/bin/python3 bench/ddp_mlp.py [--in 1024] [--hidden 1024,1024,...] [--classes 10]
        [--batch 256] [--steps 45] [--interval 5] [--skip 1] [--bucket-cap-mb 4] [--no-ddp]

Rank 0 prints a line per INTERVAL steps in fleet-train's style ("step S, ips X img/s": global
samples per second over the window), then "median_ips X" over the windows after the first SKIP.
--no-ddp trains the bare model (no DDP wrapper, no communication; WORLD_SIZE must be 1).
Needs Debian's python3-torch (1.13), importable only by /usr/bin/python3.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--in", dest="inp", type=int, default=1024)
    ap.add_argument("--hidden", default="1024,1024,1024,1024,1024,1024")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--batch", type=int, default=256, help="samples per step per worker")
    ap.add_argument("--steps", type=int, default=45)
    ap.add_argument("--interval", type=int, default=5, help="steps per progress window")
    ap.add_argument("--skip", type=int, default=1, help="warm-up windows left out of the median")
    ap.add_argument("--bucket-cap-mb", type=float, default=4.0)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--no-ddp", action="store_true")
    a = ap.parse_args()

    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if a.no_ddp and world != 1:
        sys.exit("ddp_mlp.py: --no-ddp needs WORLD_SIZE=1")
    if not a.no_ddp:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
    layers, prev = [], a.inp
    for h in [int(v) for v in a.hidden.split(",") if v]:
        layers += [torch.nn.Linear(prev, h), torch.nn.ReLU()]
        prev = h
    layers.append(torch.nn.Linear(prev, a.classes))
    model = torch.nn.Sequential(*layers)
    nparams = sum(p.numel() for p in model.parameters())
    if not a.no_ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    # this rank's shard: a pool of random batches (uniform features, random labels), cycled
    g = torch.Generator().manual_seed(1 + rank)
    pool = 8
    xs = torch.rand(pool, a.batch, a.inp, generator=g)
    ys = torch.randint(0, a.classes, (pool, a.batch), generator=g)

    if rank == 0:
        print("# ddp_mlp: torch %s, %s, world %d, %d parameters, batch %d/worker, bucket_cap_mb %g, "
              "threads %d" % (torch.__version__, "no DDP" if a.no_ddp else "DDP gloo", world,
                              nparams, a.batch, a.bucket_cap_mb, torch.get_num_threads()))
        sys.stdout.flush()
    ips = []
    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        i = step % pool
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xs[i]), ys[i])
        loss.backward()  # DDP's reducer allreduces its buckets during backward
        opt.step()
        if step % a.interval == 0:
            t1 = time.perf_counter()
            v = world * a.batch * a.interval / (t1 - t0)
            ips.append(v)
            t0 = t1
            if rank == 0:
                print("step %d, loss %.4f, ips %.1f img/s" % (step, loss.item(), v))
                sys.stdout.flush()
    if rank == 0:
        print("median_ips %.1f" % statistics.median(ips[a.skip:] or ips))
    if not a.no_ddp:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
