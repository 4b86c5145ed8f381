"""mlp_step_torch.py - the PyTorch side of bench/mlp_step.sh: times one training step
(forward, cross-entropy, backward, SGD with momentum 0.9) of the same MLP in float32.
Usage: /usr/bin/python3 mlp_step_torch.py IN H1,H2,... ACT CLASSES BATCH ITERS REPEATS THREADS
Prints the median over REPEATS of the mean step time of ITERS steps, in ms."""
import statistics
import sys
import time

import torch


def main():
    inp, hidden, act, classes, batch, iters, repeats, threads = sys.argv[1:9]
    inp, classes, batch = int(inp), int(classes), int(batch)
    iters, repeats = int(iters), int(repeats)
    torch.set_num_threads(int(threads))
    acts = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid}
    layers, prev = [], inp
    for h in [int(v) for v in hidden.split(",")]:
        layers += [torch.nn.Linear(prev, h), acts[act]()]
        prev = h
    layers.append(torch.nn.Linear(prev, classes))
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    torch.manual_seed(3)
    x = torch.rand(batch, inp)
    y = torch.randint(0, classes, (batch,))
    times = []
    for rep in range(-1, repeats):  # rep -1 warms up
        t0 = time.perf_counter()
        for _ in range(iters):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        if rep >= 0:
            times.append((time.perf_counter() - t0) * 1e3 / iters)
    print("%.4f" % statistics.median(times))


if __name__ == "__main__":
    main()
