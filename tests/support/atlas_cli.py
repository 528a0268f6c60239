"""Helpers shared by Python script tests that drive the atlas CLI (import after putting
tests/support on sys.path): run atlas with a fixed environment, record failed checks, JSON I/O."""
import json
import os
import subprocess

ATLAS = os.environ.get("ATLAS_BIN", "build/atlas")
FAILS = []


def atlas(*args, rc=0):
    """Runs atlas with progress off and one OpenMP thread; rc=None accepts any exit status."""
    e = dict(os.environ)
    e.pop("ATLAS_PROGRESS", None)
    e["OMP_NUM_THREADS"] = "1"
    p = subprocess.run([ATLAS, *args], capture_output=True, text=True, env=e)
    if rc is not None and p.returncode != rc:
        raise AssertionError(f"atlas {' '.join(args)}: rc {p.returncode} (want {rc})\n{p.stdout}\n{p.stderr}")
    return p


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL: " + what)
    else:
        print("ok   " + what)


def load(path):
    with open(path) as f:
        return json.load(f)


def dump(obj, path):
    with open(path, "w") as f:
        json.dump(obj, f)
