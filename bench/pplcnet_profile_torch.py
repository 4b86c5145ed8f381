"""pplcnet_profile_torch.py - where PyTorch 1.13 spends one training step of a network of
bench/pplcnet_step_torch.py (same network, input, optimizer and loss): torch.profiler's table of
operators by self CPU time, after 2 warm-up steps; beside it, ONEDNN_VERBOSE=1 in this script's
environment makes PyTorch's oneDNN (Debian's libdnnl, the one fleet links) print its primitives'
execution times, which bench/onednn_prims.sh sums per step as for fleet's cnn_step
(bench/RESULTS.md, issue 36).
Usage: /usr/bin/python3 pplcnet_profile_torch.py MODEL SIZE BATCH THREADS [nchw|nhwc [STEPS]]
MODEL as in pplcnet_step_torch.py (pphgnet_tiny, pplcnet_x1_0, ...); STEPS profiled, default 3."""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pplcnet_step_torch import training_setup  # noqa: E402


def main():
    if len(sys.argv) < 5:
        raise SystemExit(__doc__.split("\n")[-2])
    name, size, batch, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    layout = sys.argv[5] if len(sys.argv) > 5 else "nchw"
    steps = int(sys.argv[6]) if len(sys.argv) > 6 else 3
    if layout not in ("nchw", "nhwc") or steps < 1:
        raise SystemExit("pplcnet_profile_torch.py: layout %r is not nchw or nhwc, or STEPS %d < 1"
                         % (layout, steps))
    torch.set_num_threads(threads)
    model, x, y, opt, loss_fn = training_setup(name, 1000, batch, size, layout)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(2):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    print("pplcnet_profile_torch: %s %s %dx%d batch %d, %d threads, %d steps profiled (times "
          "below are totals over them)" % (name, layout, size, size, batch, threads, steps))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
