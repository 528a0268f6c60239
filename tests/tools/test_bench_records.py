"""tools/profile/bench_records.py on synthetic gpu_full_run.sh outputs: the default and each
ENV_CMP setting paired with its file in order, the records kept as written, one printed line per
record; a missing file, a file no setting names, a file that is not JSON, or a record without
its figure is one error naming the file, exit 1, and no output file.
"""
import json
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("ATLAS_SOURCE_DIR", ".")
TOOL = os.path.join(SRC, "tools", "profile", "bench_records.py")


def record(rate, sha):
    return {"workload": "decode-b1", "mode": "batch-invariant", "atlas": rate, "unit": "tok/s",
            "detail": {"runs": [rate - 3, rate], "tokens_sha256": sha, "first_token_s": [0.0068, 0.0032],
                       "after_first_tok_s": [rate - 1, rate + 1]}}


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f) if not isinstance(obj, str) else f.write(obj)


def run(logs, env_cmp, out):
    return subprocess.run([sys.executable, TOOL, logs, env_cmp, out], capture_output=True, text=True)


def main():
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as d:
        write(os.path.join(d, "bench.json"), [record(421.5, "1e4d6df1aa")])
        write(os.path.join(d, "bench_envcmp.json"), [record(420.4, "1e4d6df1aa")])
        write(os.path.join(d, "bench_envcmp1.json"), [record(419.8, "1e4d6df1aa")])
        out = os.path.join(d, "records.json")
        p = run(d, "CUDA_DEVICE_MAX_CONNECTIONS=8|A=1 B=2", out)
        check(p.returncode == 0, "good input: exit %d, %s" % (p.returncode, p.stderr))
        doc = json.load(open(out))
        check([r["setting"] for r in doc["runs"]] == ["default", "CUDA_DEVICE_MAX_CONNECTIONS=8", "A=1 B=2"],
              "settings in order: %s" % [r["setting"] for r in doc["runs"]])
        check([r["records"][0]["atlas"] for r in doc["runs"]] == [421.5, 420.4, 419.8], "each setting's own records")
        printed = p.stdout.strip().split("\n")
        check(len(printed) == 3, "one line per record: %r" % printed)
        check("419.800" in printed[2] and "A=1 B=2" in printed[2] and "1e4d6df1" in printed[2]
              and "first ms 6.80 3.20" in printed[2], "the last line: %r" % printed[2])

        # A setting without its file: named, nothing written.
        os.remove(out)
        p = run(d, "X=1|Y=2|Z=3", out)
        check(p.returncode == 1 and "bench_envcmp2.json: missing (setting 'Z=3')" in p.stderr,
              "missing file: exit %d, %s" % (p.returncode, p.stderr))
        check(not os.path.exists(out), "missing file: an output was written")
        # A file no setting names.
        p = run(d, "X=1", out)
        check(p.returncode == 1 and "bench_envcmp1.json: no ENV_CMP setting names it" in p.stderr,
              "extra file: exit %d, %s" % (p.returncode, p.stderr))
        check(not os.path.exists(out), "extra file: an output was written")
        # Truncated JSON.
        write(os.path.join(d, "bench_envcmp1.json"), '[{"workload": "decode-b1"')
        p = run(d, "X=1|Y=2", out)
        check(p.returncode == 1 and "bench_envcmp1.json: not JSON" in p.stderr,
              "truncated file: exit %d, %s" % (p.returncode, p.stderr))
        check(not os.path.exists(out) and not os.path.exists(out + ".tmp"), "truncated file: an output was written")
        # A record without its figure.
        write(os.path.join(d, "bench_envcmp1.json"), [{"workload": "decode-b1", "unit": "tok/s"}])
        p = run(d, "X=1|Y=2", out)
        check(p.returncode == 1 and "bench_envcmp1.json: record 0: field 'atlas' missing" in p.stderr,
              "record without atlas: exit %d, %s" % (p.returncode, p.stderr))
        check(not os.path.exists(out), "record without atlas: an output was written")

    for f in failures:
        print("FAIL: " + f)
    print("bench_records: %d checks failed" % len(failures) if failures else "bench_records: ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
