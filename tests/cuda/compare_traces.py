#!/usr/bin/env python3
"""Compare two `atlas trace --dump` files (safetensors), a CUDA one and a CPU one.

  compare_traces.py bf16 CUDA.safetensors CPU.safetensors
      hidden stages and logits: max |a - b| / max |b| <= 0.12 (the bf16 tolerance, see
      tests/cuda/model/test_cuda_model.cpp)
  compare_traces.py f32 CUDA.safetensors CPU.safetensors
      the f32 checking mode vs the CPU f32 mode in the absorbed form: every F32 tensor within
      1e-5 relative L2, every I32 tensor (top-k ids) identical (issue 5)

Prints one line per compared tensor; exits 1 at the first violation. Plain struct, no numpy:
the GPU machine may lack it.
"""
import json
import math
import struct
import sys


def load(path):
    """name -> (dtype, values) for the F32 and I32 tensors of a safetensors file."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__" or v["dtype"] not in ("F32", "I32"):
            continue
        a, b = v["data_offsets"]
        fmt = "<%d%s" % ((b - a) // 4, "f" if v["dtype"] == "F32" else "i")
        out[name] = (v["dtype"], struct.unpack(fmt, raw[8 + n + a:8 + n + b]))
    return out


def main():
    mode, ours, theirs = sys.argv[1], load(sys.argv[2]), load(sys.argv[3])
    if set(ours) != set(theirs):
        sys.exit(f"tensor names differ: {sorted(set(ours) ^ set(theirs))}")
    worst = (0.0, "")
    for name in sorted(ours):
        (dtype, x), (_, y) = ours[name], theirs[name]
        if len(x) != len(y):
            sys.exit(f"{name}: {len(x)} values vs {len(y)}")
        if mode == "bf16":
            if not (name.startswith("hidden.") or name == "logits"):
                continue
            err = max(abs(a - b) for a, b in zip(x, y)) / max(max(abs(b) for b in y), 1e-30)
            print(f"  {name}: rel {err:.4g}")
            if err > 0.12:
                sys.exit(f"{name}: relative error {err:.4g} > 0.12")
        elif dtype == "I32":
            differ = sum(a != b for a, b in zip(x, y))
            print(f"  {name}: {len(x) - differ} / {len(x)} ids identical")
            if differ:
                sys.exit(f"{name}: {differ} top-k ids differ")
        else:
            err = math.sqrt(sum((a - b) ** 2 for a, b in zip(x, y)) / max(sum(b * b for b in y), 1e-300))
            print(f"  {name}: rel L2 {err:.3g}")
            worst = max(worst, (err, name))
            if err > 1e-5:
                sys.exit(f"{name}: relative L2 {err:.3g} > 1e-5")
    if mode == "f32":
        print(f"  worst relative L2 {worst[0]:.3g} ({worst[1]})")


if __name__ == "__main__":
    main()
