"""pplcnet_step_torch.py - the PyTorch side of bench/pplcnet_step.sh: times one training step
(forward, cross-entropy, backward, SGD with momentum 0.9, weight decay 1e-4) of PaddleClas's
PP-LCNet (x0.25 .. x2.5), PP-LCNetV2-base (training form) and PP-HGNet (tiny, small, base) in
float32, 1000 classes, the ImageNet stem at every input size, written out here with the layer
shapes of fleet's zoo (src/nn/pplcnet.c, pplcnetv2.c, pphgnet.c, after PaddleClas's
ppcls/arch/backbone/legendary_models/pp_lcnet.py, pp_lcnet_v2.py, pp_hgnet.py): the trainable
parameter count printed on stderr equals fleet's (cnn_step prints its own).
Usage: /usr/bin/python3 pplcnet_step_torch.py MODEL SIZE BATCH WARMUP REPEATS THREADS
       [nchw|nhwc [MIN_SECONDS]]
MODEL pplcnet_x1_0, pplcnet_x0_25, pplcnetv2, pphgnet_tiny, ...; nhwc runs channels-last.
Prints the median over REPEATS single steps (more, up to 64, until MIN_SECONDS are timed) of
the wall time in ms, after WARMUP untimed steps (and on stderr the parameters, the steps timed
and the median CPU time per step, all threads together)."""
import resource
import statistics
import sys
import time

import torch
from torch import nn


def make_divisible(v, d=8):
    nv = max(d, int(v + d / 2) // d * d)
    return nv + d if nv < 0.9 * v else nv


def conv_bn(inp, out, k, s=1, groups=1, act=None):
    """PaddleClas's ConvBNLayer: conv (no bias, padding (k - 1) / 2), batch norm, activation."""
    mods = [nn.Conv2d(inp, out, k, s, (k - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(out)]
    if act is not None:
        mods.append(act())
    return nn.Sequential(*mods)


class SE(nn.Module):
    def __init__(self, c, gate):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c // 4, 1)
        self.conv2 = nn.Conv2d(c // 4, c, 1)
        self.gate = gate()

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * self.gate(self.conv2(torch.relu(self.conv1(s))))


class Head(nn.Module):
    """pooling, a 1x1 convolution without bias, activation, dropout, flatten, fc"""

    def __init__(self, inp, width, act, dropout, classes):
        super().__init__()
        self.last_conv = nn.Conv2d(inp, width, 1, bias=False)
        self.act = act()
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        x = self.act(self.last_conv(x.mean((2, 3), keepdim=True)))
        return self.fc(torch.flatten(self.dropout(x), 1))


# PP-LCNet: [k, in, out, stride, se] per block (blocks2 .. blocks6)
LCNET = [(3, 16, 32, 1, 0), (3, 32, 64, 2, 0), (3, 64, 64, 1, 0), (3, 64, 128, 2, 0),
         (3, 128, 128, 1, 0), (3, 128, 256, 2, 0)] + [(5, 256, 256, 1, 0)] * 5 + \
        [(5, 256, 512, 2, 1), (5, 512, 512, 1, 1)]


def pplcnet(scale, classes):
    hs = nn.Hardswish
    layers = [conv_bn(3, make_divisible(16 * scale), 3, 2, act=hs)]
    for k, i, o, s, se in LCNET:
        i, o = make_divisible(i * scale), make_divisible(o * scale)
        layers.append(conv_bn(i, i, k, s, groups=i, act=hs))
        if se:
            layers.append(SE(i, nn.Hardsigmoid))
        layers.append(conv_bn(i, o, 1, act=hs))
    layers.append(Head(make_divisible(512 * scale), 1280, hs, 0.2, classes))
    return nn.Sequential(*layers)


class RepDW(nn.Module):
    """PP-LCNetV2's RepDepthwiseSeparable in its training form"""

    def __init__(self, inp, out, s, k, split, rep, se, shortcut):
        super().__init__()
        if rep:
            self.dw = nn.ModuleList(conv_bn(inp, inp, ks, s, groups=inp)
                                    for ks in range(k, 0, -2) if not (ks == 1 and s != 1))
        else:
            self.dw = nn.ModuleList([conv_bn(inp, inp, k, s, groups=inp, act=nn.ReLU)])
        self.rep = rep
        self.se = SE(inp, nn.Sigmoid) if se else nn.Identity()
        if split:
            self.pw = nn.Sequential(conv_bn(inp, out // 2, 1, act=nn.ReLU),
                                    conv_bn(out // 2, out, 1, act=nn.ReLU))
        else:
            self.pw = conv_bn(inp, out, 1, act=nn.ReLU)
        self.shortcut = shortcut and s == 1 and inp == out

    def forward(self, x):
        y = self.dw[0](x)
        for b in self.dw[1:]:
            y = y + b(x)
        if self.rep:
            y = torch.relu(y)
        y = self.pw(self.se(y))
        return y + x if self.shortcut else y


def pplcnetv2(classes):
    # in_channels, kernel, split_pw, use_rep, use_se, use_shortcut; depths 2, 2, 6, 2
    cfg = [(64, 3, 0, 0, 0, 0), (128, 3, 0, 0, 0, 0), (256, 5, 1, 1, 1, 0), (512, 5, 0, 1, 0, 1)]
    layers = [conv_bn(3, 32, 3, 2, act=nn.ReLU), RepDW(32, 64, 1, 3, 0, 0, 0, 0)]
    for (c, k, split, rep, se, sc), depth in zip(cfg, [2, 2, 6, 2]):
        for i in range(depth):
            layers.append(RepDW(c if i == 0 else 2 * c, 2 * c, 2 if i == 0 else 1, k, split, rep,
                                se, sc))
    layers.append(Head(1024, 1280, nn.ReLU, 0.2, classes))
    return nn.Sequential(*layers)


class HGBlock(nn.Module):
    def __init__(self, inp, mid, out, n, identity):
        super().__init__()
        self.layers = nn.ModuleList(conv_bn(inp if i == 0 else mid, mid, 3, act=nn.ReLU)
                                    for i in range(n))
        self.agg = conv_bn(inp + n * mid, out, 1, act=nn.ReLU)
        self.att = nn.Conv2d(out, out, 1)
        self.identity = identity

    def forward(self, x):
        outs, y = [x], x
        for layer in self.layers:
            y = layer(y)
            outs.append(y)
        y = self.agg(torch.cat(outs, 1))
        y = y * torch.sigmoid(self.att(y.mean((2, 3), keepdim=True)))
        return y + x if self.identity else y


HGNET = {  # stem; per stage (in, mid, out, blocks, downsample); layer_num; dropout
    "tiny": ([48, 48, 96], [(96, 96, 224, 1, 0), (224, 128, 448, 1, 1), (448, 160, 512, 2, 1),
                            (512, 192, 768, 1, 1)], 5, 0.0),
    "small": ([64, 64, 128], [(128, 128, 256, 1, 0), (256, 160, 512, 1, 1),
                              (512, 192, 768, 2, 1), (768, 224, 1024, 1, 1)], 6, 0.0),
    "base": ([96, 96, 160], [(160, 192, 320, 1, 0), (320, 224, 640, 2, 1),
                             (640, 256, 960, 3, 1), (960, 288, 1280, 2, 1)], 7, 0.2),
}


def pphgnet(size, classes):
    stem, stages, n, dropout = HGNET[size]
    layers, ch = [], 3
    for i, c in enumerate(stem):
        layers.append(conv_bn(ch, c, 3, 2 if i == 0 else 1, act=nn.ReLU))
        ch = c
    layers.append(nn.MaxPool2d(3, 2, 1))
    for inp, mid, out, blocks, down in stages:
        if down:
            layers.append(conv_bn(inp, inp, 3, 2, groups=inp))
        for b in range(blocks):
            layers.append(HGBlock(inp if b == 0 else out, mid, out, n, b > 0))
    layers.append(Head(stages[-1][2], 2048, nn.ReLU, dropout, classes))
    return nn.Sequential(*layers)


def build(name, classes):
    if name.startswith("pplcnet_x"):
        return pplcnet(float(name[len("pplcnet_x"):].replace("_", ".")), classes)
    if name == "pplcnetv2":
        return pplcnetv2(classes)
    if name.startswith("pphgnet_"):
        return pphgnet(name[len("pphgnet_"):], classes)
    raise SystemExit("pplcnet_step_torch.py: unknown model " + name)


def training_setup(name, classes, batch, size, layout):
    """The network (seed 3), input, labels, SGD with momentum and loss of one timed step, in
    layout nchw or nhwc (channels-last): shared with pplcnet_profile_torch.py."""
    torch.manual_seed(3)
    model = build(name, classes)
    model.train()
    x = torch.rand(batch, 3, size, size) * 2 - 1
    if layout == "nhwc":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    y = torch.randint(0, classes, (batch,))
    return model, x, y, opt, nn.CrossEntropyLoss()


def main():
    name, size, batch, warmup, repeats, threads = sys.argv[1:7]
    layout = sys.argv[7] if len(sys.argv) > 7 else "nchw"
    min_s = float(sys.argv[8]) if len(sys.argv) > 8 else 0.0
    size, batch, warmup, repeats = int(size), int(batch), int(warmup), int(repeats)
    torch.set_num_threads(int(threads))
    model, x, y, opt, loss_fn = training_setup(name, 1000, batch, size, layout)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    times, cpu = [], []
    rep = -warmup
    while rep < repeats or (sum(times) < min_s * 1e3 and rep < 64):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if rep >= 0:
            times.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
        rep += 1
    print("%.4f" % statistics.median(times))
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print("pplcnet_step_torch: %s %s params %d, steps %d, final loss %.4f, cpu %.1f ms per step, "
          "maxrss %.1f MB" % (name, layout, params, len(times), loss.item(),
                              statistics.median(cpu), maxrss), file=sys.stderr)


if __name__ == "__main__":
    main()
