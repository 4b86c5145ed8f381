#!/usr/bin/python3
"""safetensors_read.py - an independent reader of fleet's files, for the tests: it parses the
safetensors format with nothing but json and struct (and checks fleet's CRC-32 entries with
zlib.crc32), and, when NumPy imports, reads every tensor a second way with numpy.frombuffer.

  safetensors_read.py check FILE                 parse, verify checksums, list tensors
  safetensors_read.py values FILE NAME           print a tensor's values, one per line (repr)
  safetensors_read.py same A B [--skip PREFIX]   exit 1 unless A and B hold the same tensors
                                                 with the same bytes (names with PREFIX skipped)
  safetensors_read.py npy FILE                   load a .npy with NumPy, print shape and dtype
  safetensors_read.py logits MODEL NPY FEATURES  (NumPy) the MLP forward of MODEL's weights on
                                                 FEATURES (.npy, (N, F)) must match NPY (N, C)
"""
import json
import struct
import sys
import zlib

FORMATS = {"F32": ("f", 4), "F64": ("d", 8), "I32": ("i", 4), "I64": ("q", 8),
           "U8": ("B", 1), "F16": ("e", 2)}


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = blob[8 + n:]
    mcrc = 0
    for k, v in meta.items():
        if not k.startswith("crc32."):
            mcrc = zlib.crc32(k.encode() + b"\0" + v.encode() + b"\0", mcrc)
    assert meta.get("crc32.__metadata__") == "%08x" % mcrc, "metadata checksum mismatch"
    tensors = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        raw = data[b:e]
        fmt, size = FORMATS[info["dtype"]]
        count = 1
        for d in info["shape"]:
            count *= d
        assert len(raw) == count * size, f"{name}: {len(raw)} bytes for shape {info['shape']}"
        crc = meta.get("crc32." + name)
        assert crc is not None, f"{name}: no checksum"
        assert int(crc, 16) == zlib.crc32(raw), f"{name}: checksum mismatch"
        values = struct.unpack("<%d%s" % (count, fmt), raw)
        tensors[name] = (info["dtype"], info["shape"], raw, values)
    return tensors, meta


def numpy_or_none():
    try:
        import numpy
        return numpy
    except ImportError:
        return None


def main(argv):
    cmd = argv[1]
    if cmd == "check":
        tensors, meta = read(argv[2])
        np = numpy_or_none()
        for name, (dtype, shape, raw, values) in tensors.items():
            if np is not None:
                arr = np.frombuffer(raw, dtype="<" + {"F32": "f4", "F64": "f8", "I32": "i4",
                                                      "I64": "i8", "U8": "u1",
                                                      "F16": "f2"}[dtype]).reshape(shape)
                assert arr.size == len(values)
                assert all(float(a) == float(v) for a, v in zip(arr.ravel().tolist(), values)), name
            print(f"{name} {dtype} {shape}")
        print(f"{len(tensors)} tensors, {len(meta)} metadata entries, checksums ok,"
              f" numpy {'checked' if np is not None else 'absent'}")
    elif cmd == "values":
        tensors, _ = read(argv[2])
        for v in tensors[argv[3]][3]:
            print(repr(v))
    elif cmd == "same":
        skip = argv[argv.index("--skip") + 1] if "--skip" in argv else None
        a, _ = read(argv[2])
        b, _ = read(argv[3])
        keep = lambda t: {k: v for k, v in t.items() if not (skip and k.startswith(skip))}
        a, b = keep(a), keep(b)
        if a.keys() != b.keys():
            print("different tensors:", sorted(a.keys() ^ b.keys()))
            return 1
        bad = [k for k in a if a[k][:3] != b[k][:3]]
        if bad:
            print("different bytes:", bad)
            return 1
        print(f"{len(a)} tensors bit-identical")
    elif cmd == "npy":
        np = numpy_or_none()
        arr = np.load(argv[2])
        print(arr.shape, arr.dtype)
    elif cmd == "logits":
        np = numpy_or_none()
        tensors, meta = read(argv[2])
        out = np.load(argv[3])
        x = np.load(argv[4]).astype(np.float64)
        act = {"tanh": np.tanh, "relu": lambda z: np.maximum(z, 0),
               "sigmoid": lambda z: 1 / (1 + np.exp(-z)), "none": lambda z: z}
        net = dict(line.split(": ", 1) for line in meta["fleet.network"].splitlines())
        f = act[net["model.activation"]]
        layers = sorted({k.split(".")[0] for k in tensors if k.startswith("fc")},
                        key=lambda s: int(s[2:]))
        h = x
        for i, layer in enumerate(layers):
            w = np.array(tensors[layer + ".weight"][3]).reshape(tensors[layer + ".weight"][1])
            bias = np.array(tensors[layer + ".bias"][3])
            h = h @ w.T + bias
            if i + 1 < len(layers):
                h = f(h)
        err = np.abs(h - out).max() / max(np.abs(h).max(), 1e-30)
        print(f"logits {out.shape}: max relative difference to NumPy's forward {err:.3g}")
        if out.shape != h.shape or not err < 1e-5:
            return 1
        try:
            import torch
        except ImportError:
            print("torch absent: PyTorch check skipped")
            return 0
        # the same forward in PyTorch, on tensors made from the file's bytes
        h = torch.from_numpy(np.load(argv[4]))
        tact = {"tanh": torch.tanh, "relu": torch.relu, "sigmoid": torch.sigmoid,
                "none": lambda z: z}[net["model.activation"]]
        for i, layer in enumerate(layers):
            wt = torch.frombuffer(bytearray(tensors[layer + ".weight"][2]), dtype=torch.float32)
            bt = torch.frombuffer(bytearray(tensors[layer + ".bias"][2]), dtype=torch.float32)
            h = torch.nn.functional.linear(h, wt.reshape(tensors[layer + ".weight"][1]), bt)
            if i + 1 < len(layers):
                h = tact(h)
        terr = (h - torch.from_numpy(out)).abs().max().item() / max(h.abs().max().item(), 1e-30)
        print(f"logits: max relative difference to PyTorch {torch.__version__}'s forward {terr:.3g}")
        return 0 if terr < 1e-5 else 1
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
