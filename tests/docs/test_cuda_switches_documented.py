#!/usr/bin/env python3
"""Every ATLAS_* environment variable the CUDA backend reads is a row of docs/cuda.md's
"Environment switches" table, and every row names a variable something in src/ still reads.

Why: the switches are how every A/B measurement of the backend is made and named in the
benchmark records (their `environment` field), so a switch missing from the table, or a row
left behind after its switch was removed, misleads whoever reruns a measurement.
"Reads" means: a string literal "ATLAS_..." in src/backend/cuda (the CUDA backend's switches,
all parsed by check_environment) or in src/decode (ATLAS_DEVICE_SAMPLING)."""
import os
import re
import sys
from pathlib import Path

root = Path(os.environ.get("ATLAS_SOURCE_DIR", Path(__file__).resolve().parents[2]))
doc = root / "docs" / "cuda.md"
if not doc.is_file():
    print(f"FAIL: {doc}: missing", file=sys.stderr)
    sys.exit(1)

text = doc.read_text(encoding="utf-8")
m = re.search(r"^## Environment switches\n(.*?)(?=^## |\Z)", text, re.S | re.M)
if m is None:
    print(f"FAIL: {doc}: no '## Environment switches' section", file=sys.stderr)
    sys.exit(1)
# The table's first column: one or more `ATLAS_X` names (several switches may share a row).
documented = set()
for line in m.group(1).splitlines():
    if not line.startswith("| `ATLAS_"):
        continue
    first_cell = line.split("|")[1]
    documented.update(re.findall(r"`(ATLAS_[A-Z0-9_]+)`", first_cell))

literal = re.compile(r'"(ATLAS_[A-Z0-9_]+)')
read = {}
for folder in ("src/backend/cuda", "src/decode"):
    for path in sorted((root / folder).rglob("*")):
        if path.suffix not in (".cpp", ".h", ".cu", ".cuh"):
            continue
        for name in literal.findall(path.read_text(encoding="utf-8")):
            read.setdefault(name, str(path.relative_to(root)))
read.pop("ATLAS_GIT_COMMIT", None)  # a build definition, not a switch

if len(read) < 10 or len(documented) < 10:  # the scan itself broke (moved folders, a new table form)
    print(f"FAIL: found {len(read)} variables in src and {len(documented)} rows in {doc}: expected dozens",
          file=sys.stderr)
    sys.exit(1)

errors = []
for name in sorted(set(read) - documented):
    errors.append(f"{doc}: Environment switches: no row for {name} (read in {read[name]})")
all_src = "\n".join(p.read_text(encoding="utf-8", errors="replace")
                    for p in (root / "src").rglob("*") if p.suffix in (".cpp", ".h", ".cu", ".cuh"))
for name in sorted(documented - set(read)):
    if f'"{name}' not in all_src:
        errors.append(f"{doc}: Environment switches: row for {name}, which nothing in src/ reads")
for e in errors:
    print("FAIL: " + e, file=sys.stderr)
if errors:
    sys.exit(1)
print(f"ok: {len(read)} variables read, each documented; {len(documented)} rows, each read")
