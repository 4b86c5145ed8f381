"""ctr_train_torch.py - the PyTorch side of bench/ctr_train.sh: the same wide&deep on the same
ctr_synth samples as bench/ctr_train.c (which writes them with DUMP_DIR), trained the same way.

Model: nn.EmbeddingBag(rows, 10, mode='sum', sparse=True) for the slot embeddings and
nn.EmbeddingBag(rows, 1, mode='sum', sparse=True) for the wide part, the 13 dense features
concatenated after the 26 embeddings into Linear-ReLU 400-400-400 then Linear(400, 1), plus
Linear(13, 1) over the dense features and the sum of the wide values: fleet's wide&deep
(include/fleet/sparse.h), nn.Linear's own initialisation (fleet's fc draws the same law).
Optimizers as fleet's: the embedding tables by Paddle's sparse Adagrad rule (one g2sum a row,
w -= lr g sqrt(3 / (3 + g2sum)), then g2sum += mean(g^2); src/ps/table.h), applied to the
coalesced sparse gradient's rows only (--opt adagrad: torch.optim.Adagrad's own sparse rule
instead); the dense part SGD with momentum 0.9 (fleet's Momentum is the same update).
Rows: uniform(-0.05, 0.05) embeddings, zero wide values, as fleet's tables create them. The
tables are dense tensors of the data's distinct ids (bench/ctr_train.c numbers them), so
PyTorch pays no id hashing, which fleet's tables do.

Usage: /usr/bin/python3 ctr_train_torch.py DUMP_DIR BATCH STEPS PASSES THREADS [--opt adagrad]
Prints the same line as ctr_train: median examples/s of passes 1.., each pass's, the AUC after
each pass, the median examples per CPU second (time.process_time: all threads) (bucketed as Paddle's auc operator, as fleet's) and the final log loss. The median of
an even count is the upper middle one, as bench_median takes it. CTR_TRAIN_PHASES set: also
prints to stderr the CPU milliseconds a step of forward and loss, backward, the sparse rule and
Momentum, over the timed passes (as ctr_train's)."""
import os
import sys
import time

import numpy as np
import torch

SPARSE_LR = 2.0
DENSE_LR = 0.1
EMBED_DIM = 10
HIDDEN = (400, 400, 400)


def load(d, prefix, samples, nslots, ndense):
    labels = np.fromfile(os.path.join(d, prefix + "labels.i32"), dtype=np.int32)
    dense = np.fromfile(os.path.join(d, prefix + "dense.f32"), dtype=np.float32)
    offsets = np.fromfile(os.path.join(d, prefix + "offsets.i64"), dtype=np.int64)
    index = np.fromfile(os.path.join(d, prefix + "index.i64"), dtype=np.int64)
    assert labels.size == samples and dense.size == samples * ndense
    assert offsets.size == samples * nslots + 1 and offsets[-1] == index.size
    return (torch.from_numpy(labels.astype(np.float32)), torch.from_numpy(dense).view(samples, ndense),
            torch.from_numpy(offsets), torch.from_numpy(index))


def batch_of(data, nslots, i0, n):
    """Samples [i0, i0 + n): labels, dense, the bags' offsets (n * nslots + 1) and ids."""
    labels, dense, offsets, index = data
    o = offsets[i0 * nslots:(i0 + n) * nslots + 1]
    return labels[i0:i0 + n], dense[i0:i0 + n], o - o[0], index[o[0]:o[-1]]


class WideDeep(torch.nn.Module):
    def __init__(self, rows, nslots, ndense):
        super().__init__()
        self.nslots = nslots
        self.embedding = torch.nn.EmbeddingBag(rows, EMBED_DIM, mode="sum", sparse=True,
                                               include_last_offset=True)
        self.wide = torch.nn.EmbeddingBag(rows, 1, mode="sum", sparse=True,
                                          include_last_offset=True)
        with torch.no_grad():
            self.embedding.weight.uniform_(-0.05, 0.05)
            self.wide.weight.zero_()
        layers, prev = [], nslots * EMBED_DIM + ndense
        for h in HIDDEN:
            layers += [torch.nn.Linear(prev, h), torch.nn.ReLU()]
            prev = h
        layers.append(torch.nn.Linear(prev, 1))
        self.deep = torch.nn.Sequential(*layers)
        self.wide_part = torch.nn.Linear(ndense, 1)

    def forward(self, dense, offsets, index):
        b = dense.shape[0]
        e = self.embedding(index, offsets).view(b, self.nslots * EMBED_DIM)
        w = self.wide(index, offsets).view(b, self.nslots).sum(1)
        x = torch.cat([e, dense], 1)
        return self.deep(x).squeeze(1) + self.wide_part(dense).squeeze(1) + w


class PaddleSparseAdagrad:
    """Paddle's SparseAdaGradSGDRule on the rows a sparse gradient touches."""

    def __init__(self, params, lr, initial_g2sum=3.0):
        self.params, self.lr, self.g0 = list(params), lr, initial_g2sum
        self.g2sum = [torch.zeros(p.shape[0]) for p in self.params]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, g2 in zip(self.params, self.g2sum):
            g = p.grad.coalesce()
            idx, val = g.indices()[0], g.values()
            scale = torch.sqrt(self.g0 / (self.g0 + g2[idx]))
            p.index_add_(0, idx, val * (-self.lr * scale).unsqueeze(1))
            g2.index_add_(0, idx, val.pow(2).mean(1))


def auc_of(p, y, thresholds=4095):
    """Paddle's auc operator, as fl_ctr_metrics: float32 p * T bucketed, the ROC walked from the
    top bucket down, trapezoids, divided by positives x negatives."""
    b = (p.astype(np.float32) * np.float32(thresholds)).astype(np.int64)
    pos = np.bincount(b[y == 1], minlength=thresholds + 1)[::-1].astype(np.float64)
    neg = np.bincount(b[y == 0], minlength=thresholds + 1)[::-1].astype(np.float64)
    tp, fp = np.cumsum(pos), np.cumsum(neg)
    tp0 = np.concatenate([[0.0], tp[:-1]])
    area = np.sum(neg * (tp0 + tp) / 2.0)
    return area / (tp[-1] * fp[-1]) if tp[-1] > 0 and fp[-1] > 0 else 0.0


def main():
    d, batch, steps, passes, threads = sys.argv[1:6]
    batch, steps, passes, threads = int(batch), int(steps), int(passes), int(threads)
    stock = "--opt" in sys.argv and sys.argv[sys.argv.index("--opt") + 1] == "adagrad"
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    samples, vsamples, nslots, ndense, rows = open(os.path.join(d, "meta.txt")).read().split()[:5]
    samples, vsamples, nslots, ndense, rows = map(int, (samples, vsamples, nslots, ndense, rows))
    assert samples == batch * steps * passes
    train = load(d, "train_", samples, nslots, ndense)
    val = load(d, "val_", vsamples, nslots, ndense)
    model = WideDeep(rows, nslots, ndense)
    sparse_params = [model.embedding.weight, model.wide.weight]
    dense_params = [p for n, p in model.named_parameters()
                    if not n.startswith(("embedding.", "wide."))]
    if stock:
        sopt = torch.optim.Adagrad(sparse_params, lr=SPARSE_LR * 0.005)
    else:
        sopt = PaddleSparseAdagrad(sparse_params, SPARSE_LR)
    dopt = torch.optim.SGD(dense_params, lr=DENSE_LR, momentum=0.9)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    batches = [batch_of(train, nslots, k * batch, batch) for k in range(steps * passes)]
    rates, cpu_rates, aucs, logloss = [], [], [], float("nan")
    phases = "CTR_TRAIN_PHASES" in os.environ
    phase_s = [0.0] * 4  # forward+loss, backward, sparse Adagrad, momentum
    for p in range(passes):
        t0, c0 = time.perf_counter(), time.process_time()
        for k in range(p * steps, (p + 1) * steps):
            y, x, off, idx = batches[k]
            if phases:
                q0 = time.process_time()
            sopt.zero_grad()
            dopt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x, off, idx), y)
            if phases:
                q1 = time.process_time()
            loss.backward()
            if phases:
                q2 = time.process_time()
            sopt.step()
            if phases:
                q3 = time.process_time()
            dopt.step()
            if phases and p > 0:
                q4 = time.process_time()
                for i, d in enumerate((q1 - q0, q2 - q1, q3 - q2, q4 - q3)):
                    phase_s[i] += d
        rates.append(steps * batch / (time.perf_counter() - t0))
        cpu_rates.append(steps * batch / (time.process_time() - c0))
        with torch.no_grad():
            y, x, off, idx = batch_of(val, nslots, 0, vsamples)
            z = model(x, off, idx)
            pr = torch.sigmoid(z).numpy()
            logloss = loss_fn(z, y).item()
            aucs.append(auc_of(pr, y.numpy().astype(np.int32)))
    if phases:
        n = (passes - 1) * steps
        print("ctr_train_torch: CPU ms a step over passes 1-%d: forward+loss %.3f backward %.3f "
              "sparse-adagrad %.3f momentum %.3f"
              % ((passes - 1,) + tuple(1e3 * v / n for v in phase_s)), file=sys.stderr)
    print("%.1f passes %s auc %s cpu %.1f logloss %.4f" % (
        sorted(rates[1:])[(len(rates) - 1) // 2],
        " ".join("%.1f" % r for r in rates), " ".join("%.4f" % a for a in aucs),
        sorted(cpu_rates[1:])[(len(cpu_rates) - 1) // 2], logloss))


if __name__ == "__main__":
    main()
