"""tools/profile/cubin_ops.py on a synthetic listing and ELF whose answers are known: the opcode
table learnt from cuobjdump-shaped lines (a clash refused), then a section's instructions named
from their first 8 bytes, and the wgmma stream loop's bounds (last DEPBAR before the barrier
ahead of the first HGMMA, to the branch after the last HGMMA) and mix.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

SRC = os.environ.get("ATLAS_SOURCE_DIR", ".")
TOOL = os.path.join(SRC, "tools", "profile", "cubin_ops.py")

if not shutil.which("as") or not shutil.which("readelf"):
    print("SKIP: needs GNU as and readelf")
    sys.exit(77)

# Mnemonic -> opcode (low 12 bits of the first word), as a listing would show them.
OPS = {"DEPBAR": 0x91A, "BAR": 0xB1D, "R2UR": 0x2CA, "HGMMA": 0x9F0, "BRA": 0x947, "IMAD": 0x424,
       "UIADD3": 0x290, "EXIT": 0x94D}


def word(op, predicated=False):
    return (0x0 if predicated else 0x7000) | OPS[op]


def run(*args, ok=True):
    r = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)
    if ok and r.returncode != 0:
        sys.exit(f"FAIL: {args}: rc {r.returncode}: {r.stderr}")
    if not ok and r.returncode == 0:
        sys.exit(f"FAIL: {args}: expected an error, got rc 0: {r.stdout}")
    return r


with tempfile.TemporaryDirectory() as d:
    listing = os.path.join(d, "sass.txt")
    with open(listing, "w") as f:
        f.write("\t\tFunction : fake\n")
        for i, (m, op) in enumerate(OPS.items()):
            f.write("        /*%04x*/                   %s.X R1, R2 ;   /* 0x%016x */\n" % (16 * i, m, 0x7000 | op))
            f.write("                                                   /* 0x000fe20000000000 */\n")
    table = os.path.join(d, "ops.json")
    run("table", listing, table)
    t = json.load(open(table))
    if t != {str(v): k for k, v in OPS.items()}:
        sys.exit(f"FAIL: table {t}")

    # A clash (one opcode, two mnemonics) is refused, naming the file; no table is written.
    clash = os.path.join(d, "clash.txt")
    with open(clash, "w") as f:
        f.write("        /*0000*/   IMAD R1, R2 ;   /* 0x0000000000007424 */\n")
        f.write("        /*0010*/   IADD3 R1, R2 ;   /* 0x0000000000007424 */\n")
    r = run("table", clash, os.path.join(d, "clash.json"), ok=False)
    if "clash.txt" not in r.stderr or os.path.exists(os.path.join(d, "clash.json")):
        sys.exit(f"FAIL: clash: {r.stderr}")

    # A kernel: prologue, then the loop DEPBAR .. BRA (9 instructions), then EXIT.
    seq = [("IMAD", 0), ("DEPBAR", 0), ("IMAD", 0), ("DEPBAR", 0), ("BAR", 0), ("R2UR", 0), ("HGMMA", 0),
           ("UIADD3", 0), ("HGMMA", 0), ("IMAD", 0), ("BRA", 1), ("EXIT", 1)]
    asm = os.path.join(d, "k.s")
    with open(asm, "w") as f:
        f.write('.section .text.fake_lean_kernel,"ax"\n')
        for m, pred in seq:
            f.write(".quad 0x%x\n.quad 0\n" % word(m, pred))
        f.write('.section .text.other,"ax"\n.quad 0x7424\n.quad 0\n')
    obj = os.path.join(d, "k.o")
    subprocess.run(["as", "-o", obj, asm], check=True)

    r = run("show", obj, "lean_kernel", "--table", table, "--ops", "--loop")
    out = r.stdout.splitlines()
    if out[0] != "== fake_lean_kernel: 12 instructions":
        sys.exit(f"FAIL: header {out[0]!r}")
    listed = [line.split()[-1] for line in out[1:13]]
    if listed != [m for m, _ in seq] or "@P " not in out[11]:
        sys.exit(f"FAIL: ops {out[1:13]}")
    # The loop: the DEPBAR at 3 (the last before the BAR) to the BRA at 10.
    want = "   loop: 8 instructions (HGMMA 2, LDGSTS 0, R2UR 1, BSSY 0, CALL 0; uniform-datapath U*: 1)"
    if out[13] != want:
        sys.exit(f"FAIL: loop {out[13]!r}")
    if "other" in r.stdout:
        sys.exit("FAIL: a section the pattern does not match was shown")

    r = run("show", obj, "no_such_kernel", "--table", table, ok=False)
    if "no .text section" not in r.stderr:
        sys.exit(f"FAIL: no match: {r.stderr}")
    r = run("show", os.path.join(d, "missing.cubin"), "x", "--table", table, ok=False)
    if "missing.cubin" not in r.stderr:
        sys.exit(f"FAIL: missing file: {r.stderr}")

    # `same`: kernel a kept under its name, b renamed (a template argument added), c changed;
    # d is new. Exit 1, naming c only.
    def elf(path, secs):
        src = path + ".s"
        with open(src, "w") as f:
            for name, words in secs:
                f.write('.section .text.%s,"ax"\n' % name)
                for w in words:
                    f.write(".quad 0x%x\n.quad 0\n" % w)
        subprocess.run(["as", "-o", path, src], check=True)
    before, after = os.path.join(d, "before.o"), os.path.join(d, "after.o")
    elf(before, [("ka", [0x7424, 0x794D]), ("kb", [0x7290, 0x794D]), ("kc", [0x7424, 0x7424, 0x794D])])
    elf(after, [("ka", [0x7424, 0x794D]), ("kb_Lb0E", [0x7290, 0x794D]), ("kc", [0x7424, 0x794D, 0x794D]),
                ("kd", [0x7947])])
    r = run("same", before, after, "--verbose", ok=False)
    if r.returncode != 1 or "changed  kc" not in r.stdout or "renamed  kb -> kb_Lb0E" not in r.stdout or \
            "3 kernels of" not in r.stdout or "1 the same under their names, 1 the same under another name, 1 changed" \
            not in r.stdout or "changed  ka" in r.stdout:
        sys.exit(f"FAIL: same: rc {r.returncode}: {r.stdout}")
    r = run("same", before, after, "k[ab]")
    if "2 kernels of" not in r.stdout or "0 changed" not in r.stdout:
        sys.exit(f"FAIL: same with a pattern: {r.stdout}")

print("cubin_ops: table, clash, ops, loop bounds and same as expected")
