"""cnn_step_torch.py - the PyTorch side of bench/cnn_step.sh: times one training step
(forward, cross-entropy, backward, SGD with momentum 0.9, weight decay 1e-4) of the same ResNet
in float32, NCHW. The models are written out here (Debian ships no torchvision): the CIFAR
ResNet with option-A shortcuts (channels zero-padded in the middle) and torchvision's ResNet
(v1.5, bottleneck stride in the 3x3), ReLUs in place as torchvision has them.
Usage: /usr/bin/python3 cnn_step_torch.py MODEL BATCH ITERS REPEATS THREADS
Prints the median over REPEATS of the mean step time of ITERS steps, in ms (and on stderr the
median CPU time per step, all threads together)."""
import resource
import statistics
import sys
import time

import torch
from torch import nn
import torch.nn.functional as F


class Basic(nn.Module):
    expansion = 1

    def __init__(self, inp, planes, stride, shortcut):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.pad = None
        self.downsample = None
        if stride != 1 or inp != planes:
            if shortcut == "A":
                self.pad = (stride, (planes - inp) // 2, planes - inp - (planes - inp) // 2)
            else:
                self.downsample = nn.Sequential(nn.Conv2d(inp, planes, 1, stride, bias=False),
                                                nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        if self.pad:
            s, lo, hi = self.pad
            x = F.pad(x[:, :, ::s, ::s], (0, 0, 0, 0, lo, hi))
        elif self.downsample is not None:
            x = self.downsample(x)
        return F.relu(out + x, inplace=True)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inp, planes, stride, shortcut):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.downsample = None
        if stride != 1 or inp != planes * 4:
            self.downsample = nn.Sequential(nn.Conv2d(inp, planes * 4, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes * 4))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = F.relu(self.bn2(self.conv2(out)), inplace=True)
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            x = self.downsample(x)
        return F.relu(out + x, inplace=True)


class ResNet(nn.Module):
    def __init__(self, block, blocks, base, stem, classes, shortcut):
        super().__init__()
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(3, base, 7, 2, 3, bias=False)
            self.pool = nn.MaxPool2d(3, 2, 1)
        else:
            self.conv1 = nn.Conv2d(3, base, 3, 1, 1, bias=False)
            self.pool = nn.Identity()
        self.bn1 = nn.BatchNorm2d(base)
        layers, inp = [], base
        for i, n in enumerate(blocks):
            planes, mods = base << i, []
            for j in range(n):
                mods.append(block(inp, planes, 2 if i > 0 and j == 0 else 1, shortcut))
                inp = planes * block.expansion
            layers.append(nn.Sequential(*mods))
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(inp, classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x)), inplace=True))
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build(name):
    depth = int(name[len("resnet"):])
    imagenet = {18: (Basic, [2, 2, 2, 2]), 34: (Basic, [3, 4, 6, 3]),
                50: (Bottleneck, [3, 4, 6, 3]), 101: (Bottleneck, [3, 4, 23, 3]),
                152: (Bottleneck, [3, 8, 36, 3])}
    if depth % 6 == 2 and depth not in imagenet:
        n = (depth - 2) // 6
        return ResNet(Basic, [n, n, n], 16, "cifar", 10, "A"), 32, 10
    block, blocks = imagenet[depth]
    return ResNet(block, blocks, 64, "imagenet", 1000, "B"), 224, 1000


def main():
    name, batch, iters, repeats, threads = sys.argv[1:6]
    batch, iters, repeats = int(batch), int(iters), int(repeats)
    torch.set_num_threads(int(threads))
    torch.manual_seed(3)
    model, size, classes = build(name)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.rand(batch, 3, size, size) * 2 - 1
    y = torch.randint(0, classes, (batch,))
    times, cpu = [], []
    for rep in range(-1, repeats):  # rep -1 warms up
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(iters):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        if rep >= 0:
            times.append((time.perf_counter() - t0) * 1e3 / iters)
            cpu.append((time.process_time() - c0) * 1e3 / iters)
    print("%.4f" % statistics.median(times))
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print("cnn_step_torch: %s cpu %.1f ms per step, maxrss %.1f MB"
          % (name, statistics.median(cpu), maxrss), file=sys.stderr)


if __name__ == "__main__":
    main()
