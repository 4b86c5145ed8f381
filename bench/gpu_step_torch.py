"""gpu_step_torch.py - the PyTorch side of bench/gpu_step.sh: one training step of torchvision's
ResNet-50 (3x224x224, 1000 classes) on GPU 0 - forward, cross-entropy, backward, SGD with
momentum 0.9 and weight decay 1e-4 - as bench/cnn_step.c does it on fleet's cuda backend.

    python3 gpu_step_torch.py BATCH ITERS REPEATS PRECISION [eager|compile]

PRECISION: f32 (TF32 off), tf32, f16 (autocast float16 with a GradScaler, channels-last),
bf16 (autocast bfloat16, channels-last). Prints the median over REPEATS of the mean step time
of ITERS steps in ms on stdout, and the peak device memory the caching allocator held on stderr. compile wraps the model
in torch.compile (its compile time is spent in the warm-up repeat, not timed)."""
import statistics
import sys
import time

import torch
import torchvision


def main():
    batch, iters, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    precision = sys.argv[4]
    mode = sys.argv[5] if len(sys.argv) > 5 else "eager"
    assert precision in ("f32", "tf32", "f16", "bf16") and mode in ("eager", "compile")
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torchvision.models.resnet50().to(dev)
    amp = precision in ("f16", "bf16")
    fmt = torch.channels_last if amp else torch.contiguous_format
    model = model.to(memory_format=fmt)
    x = torch.rand(batch, 3, 224, 224, device=dev).mul_(2).sub_(1).to(memory_format=fmt)
    y = torch.randint(0, 1000, (batch,), device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    dtype = torch.float16 if precision == "f16" else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "f16")
    net = torch.compile(model) if mode == "compile" else model

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype, enabled=amp):
            loss = loss_fn(net(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    times = []
    for rep in range(-1, repeats):  # -1 warms up (cuDNN's autotuning, torch.compile)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters if rep >= 0 else max(iters, 3)):
            loss = step()
        torch.cuda.synchronize()
        if rep >= 0:
            times.append((time.perf_counter() - t0) * 1e3 / iters)
    print("%.4f" % statistics.median(times))
    print("gpu_step_torch: resnet50 batch %d %s %s: final loss %.4f, device memory peak %.1f MiB"
          % (batch, precision, mode, loss.item(), torch.cuda.max_memory_reserved() / 2**20),
          file=sys.stderr)


if __name__ == "__main__":
    main()
