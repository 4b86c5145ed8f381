#!/usr/bin/python3
"""check_rescale.py - checks, from the files alone, how fleet-train combined a checkpoint of W0
workers into the state of W1 workers (docs/elastic.md):

  check_rescale.py OLD_STEP_DIR NEW_STEP_DIR

OLD holds rank_0..rank_<W0-1>.safetensors (or model.safetensors), NEW the checkpoint the
resumed job of W1 workers wrote at the same step before training on. Every worker's network
and optimizer tensors must be the mean over the old workers; DGC's residuals (dgc.u.*, dgc.v.*)
of new worker r the sum of the old workers j with j mod W1 == r, so that their sum over the
workers is unchanged; counters (integer tensors) rank 0's. Exits 1 naming the first tensor at
fault. Uses safetensors_read.py's reader (json, struct, zlib only)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_read import read  # noqa: E402


def files(step_dir):
    one = os.path.join(step_dir, "model.safetensors")
    if os.path.exists(one):
        return [read(one)[0]]
    out, r = [], 0
    while os.path.exists(os.path.join(step_dir, "rank_%d.safetensors" % r)):
        out.append(read(os.path.join(step_dir, "rank_%d.safetensors" % r))[0])
        r += 1
    return out


def close(a, b, what):
    for i, (x, y) in enumerate(zip(a, b)):
        if abs(x - y) > 1e-6 * max(1.0, abs(x), abs(y)):
            sys.exit("check_rescale: %s: element %d is %r, expected %r" % (what, i, x, y))


def main():
    old, new = files(sys.argv[1]), files(sys.argv[2])
    if not old or not new:
        sys.exit("check_rescale: no checkpoint files in %s or %s" % (sys.argv[1], sys.argv[2]))
    w0, w1 = len(old), len(new)
    summed = checked = 0
    for name, (dtype, shape, _, _) in old[0].items():
        if name == "train.state":
            continue
        for r, f in enumerate(new):
            if name not in f or f[name][1] != shape:
                sys.exit("check_rescale: new rank %d: '%s' missing or reshaped" % (r, name))
            got = f[name][3]
            if dtype not in ("F32", "F64"):
                want = old[0][name][3]
                if got != want:
                    sys.exit("check_rescale: new rank %d: '%s' is %r, rank 0's %r"
                             % (r, name, got, want))
                continue
            if name.startswith("dgc."):
                parts = [old[j][name][3] for j in range(w0) if j % w1 == r]
                want = [sum(v) for v in zip(*parts)] if parts else [0.0] * len(got)
                summed += 1
            else:
                want = [sum(v) / w0 for v in zip(*(o[name][3] for o in old))]
            close(got, want, "new rank %d: '%s'" % (r, name))
            checked += 1
        if name.startswith("dgc.v.") and len(new) > 1:
            total_old = sum(sum(o[name][3]) for o in old)
            total_new = sum(sum(f[name][3]) for f in new)
            close([total_new], [total_old], "'%s' summed over the workers" % name)
    print("check_rescale: %d rank file(s) -> %d: %d tensors checked (%d summed residuals)"
          % (w0, w1, checked, summed))


main()
