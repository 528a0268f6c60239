#!/usr/bin/env python3
"""A mnemonic-only view of sm_90a kernels in a cubin, for machines without cuobjdump/nvdisasm.

The CPU machines have nvcc and ptxas but no disassembler, so session 31 counted SASS instructions
there this way: every SASS instruction is 16 bytes, and the low 12 bits of its first 8 bytes name
its opcode. `table` learns the opcode -> mnemonic map from a device's `cuobjdump -sass` listing
(the gpu_full_run.sh `sass` step writes one: sass.txt), refusing a listing where two mnemonics
share an opcode; `show` then lists a local cubin's kernels whose section names match a regex, with
their sizes, and with --ops their instructions (offset, predicated or not, mnemonic; operands are
not decoded), or with --loop the main loop's static size: from the last DEPBAR before the block
barrier ahead of the first HGMMA to the branch after the last HGMMA (the wgmma stream loops'
shape). Opcodes the table lacks print as ?xyz. `same` says, for each kernel of one cubin, whether
another cubin holds its code byte for byte (under its name, or under another: a template
argument added with a default renames every instantiation), so a change that must leave the
default kernels as they were (a diagnostic instantiation beside them) can be checked here, with
no GPU and no disassembler; it exits 1 where any kernel's code changed or went.

  python3 tools/profile/cubin_ops.py table sass.txt tools/profile/sm90a_opcodes.json
  nvcc -DATLAS_HAVE_CUDA -Isrc -O3 -DNDEBUG -arch=sm_90a --fmad=false -std=c++20 -cubin -o /tmp/k.cubin FILE.cu
  python3 tools/profile/cubin_ops.py show /tmp/k.cubin 'lean_kernel.*Lb1E' --loop
  python3 tools/profile/cubin_ops.py same /tmp/before.cubin /tmp/after.cubin [PATTERN]
"""
import argparse
import collections
import json
import os
import re
import struct
import subprocess
import sys

DEFAULT_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sm90a_opcodes.json")
LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)[^;]*;\s+/\* 0x([0-9a-f]{16}) \*/")


def die(msg):
    print("cubin_ops: " + msg, file=sys.stderr)
    sys.exit(1)


def learn(listing, out):
    seen = collections.defaultdict(collections.Counter)
    try:
        with open(listing) as f:
            for line in f:
                m = LINE.match(line)
                if m:
                    seen[int(m.group(4), 16) & 0xFFF][m.group(3).split(".")[0]] += 1
    except OSError as e:
        die(f"{listing}: {e.strerror}")
    if not seen:
        die(f"{listing}: no SASS instruction lines (a `cuobjdump -sass` listing?)")
    clash = {hex(k): sorted(v) for k, v in seen.items() if len(v) > 1}
    if clash:
        die(f"{listing}: opcodes with more than one mnemonic: {clash}")
    table = {str(k): next(iter(v)) for k, v in sorted(seen.items())}
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(table, f, indent=0, sort_keys=True)
        f.write("\n")
    os.replace(tmp, out)
    print(f"{len(table)} opcodes -> {out}")


def sections(cubin, pattern):
    try:
        res = subprocess.run(["readelf", "-SW", cubin], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        die(f"{cubin}: readelf failed: {e}")
    for line in res.stdout.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if m and m.group(1).startswith(".text.") and re.search(pattern, m.group(1)):
            yield m.group(1)[len(".text."):], int(m.group(2), 16), int(m.group(3), 16)


def show(args):
    try:
        with open(args.table) as f:
            table = json.load(f)
        with open(args.cubin, "rb") as f:
            data = f.read()
    except OSError as e:
        die(f"{e.filename}: {e.strerror}")
    except json.JSONDecodeError as e:
        die(f"{args.table}: not JSON ({e})")
    found = False
    for name, off, size in sections(args.cubin, args.pattern):
        found = True
        ops = []
        for i in range(0, size, 16):
            w = struct.unpack_from("<Q", data, off + i)[0]
            ops.append((i, ((w >> 12) & 0xF) != 7, table.get(str(w & 0xFFF), "?%03x" % (w & 0xFFF))))
        print(f"== {name}: {len(ops)} instructions")
        if args.ops:
            for i, pred, op in ops:
                print("%05x %s%s" % (i, "@P " if pred else "", op))
        if args.loop:
            names = [op for _, _, op in ops]
            hg = [i for i, op in enumerate(names) if op == "HGMMA"]
            bars = [i for i in range(hg[0]) if names[i] == "BAR"] if hg else []
            heads = [i for i in range(bars[-1]) if names[i] == "DEPBAR"] if bars else []
            ends = [i for i in range(hg[-1], len(names)) if names[i] == "BRA"] if hg else []
            if not (heads and ends):
                print("   no loop of the wgmma stream shape")
                continue
            body = collections.Counter(names[heads[-1]:ends[0] + 1])
            keys = ["HGMMA", "LDGSTS", "R2UR", "BSSY", "CALL"]
            print("   loop: %d instructions (%s; uniform-datapath U*: %d)" % (
                ends[0] - heads[-1] + 1, ", ".join(f"{k} {body[k]}" for k in keys),
                sum(v for k, v in body.items() if k.startswith("U"))))
    if not found:
        die(f"{args.cubin}: no .text section matches {args.pattern!r}")


def code(cubin, pattern):
    """{kernel name: its .text bytes} of the sections whose names match pattern."""
    try:
        with open(cubin, "rb") as f:
            data = f.read()
    except OSError as e:
        die(f"{e.filename}: {e.strerror}")
    return {name: data[off:off + size] for name, off, size in sections(cubin, pattern)}


def same(args):
    old, new = code(args.old, args.pattern), code(args.new, args.pattern)
    if not old:
        die(f"{args.old}: no .text section matches {args.pattern!r}")
    by_bytes = {}
    for name, b in new.items():
        by_bytes.setdefault(b, []).append(name)
    kept = renamed = 0
    changed = []
    for name, b in sorted(old.items()):
        if new.get(name) == b:
            kept += 1
        elif b in by_bytes:
            renamed += 1
            if args.verbose:
                print(f"renamed  {name} -> {by_bytes[b][0]}")
        else:
            changed.append(name)
            print(f"changed  {name}" + ("" if name in new else " (no section of that name)"))
    print(f"{len(old)} kernels of {args.old}: {kept} the same under their names, {renamed} the same under "
          f"another name, {len(changed)} changed; {len(new)} kernels in {args.new}")
    sys.exit(1 if changed else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="learn the opcode table from a cuobjdump -sass listing")
    t.add_argument("listing")
    t.add_argument("out", nargs="?", default=DEFAULT_TABLE)
    s = sub.add_parser("show", help="kernels of a cubin: sizes, --ops, --loop")
    s.add_argument("cubin")
    s.add_argument("pattern", help="regex over the mangled section name")
    s.add_argument("--table", default=DEFAULT_TABLE)
    s.add_argument("--ops", action="store_true", help="every instruction's mnemonic")
    s.add_argument("--loop", action="store_true", help="the wgmma stream loop's static size and mix")
    c = sub.add_parser("same", help="which kernels of OLD have the same code in NEW")
    c.add_argument("old")
    c.add_argument("new")
    c.add_argument("pattern", nargs="?", default="", help="regex over the mangled section name")
    c.add_argument("--verbose", action="store_true", help="name the renamed kernels too")
    a = ap.parse_args()
    if a.cmd == "table":
        learn(a.listing, a.out)
    elif a.cmd == "same":
        same(a)
    else:
        show(a)


if __name__ == "__main__":
    main()
