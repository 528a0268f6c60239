#!/usr/bin/env python3
"""Gathers one tests/cuda/gpu_full_run.sh call's `atlas bench --json` outputs into one file, as
bench/results/ keeps them: runs[0] the bench step ("default", bench.json), then each ENV_CMP
setting in its order (bench_envcmp.json, bench_envcmp1.json, ...), each with its records as
atlas wrote them. Prints one line per record: the figure, each run's, the tokens' hash prefix,
and for decode-b1 each run's first token (ms) and rate after it.

    tools/profile/bench_records.py LOGS_DIR 'SETTING|SETTING|...' OUT.json

A setting without its file, or a file no setting names, is an error (exit 1, nothing written):
the labels would otherwise shift onto the wrong records. So is a file that is not a JSON list of
records with workload, atlas and unit.
"""
import json
import os
import sys

NOTE = ("atlas bench --json records of one gpu_full_run.sh call: 'default' (the bench step), then each "
        "ENV_CMP setting in its order (envcmp files)")


def envcmp_file(logs, i):
    return os.path.join(logs, "bench_envcmp.json" if i == 0 else "bench_envcmp%d.json" % i)


def gather(logs, env_cmp):
    settings = env_cmp.split("|") if env_cmp else []
    paths = [("default", os.path.join(logs, "bench.json"))] + [(s, envcmp_file(logs, i)) for i, s in enumerate(settings)]
    runs = []
    for setting, path in paths:
        if not os.path.isfile(path):
            raise ValueError("%s: missing (setting '%s')" % (path, setting))
        try:
            with open(path) as f:
                records = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError("%s: not JSON (%s)" % (path, e))
        if not isinstance(records, list):
            raise ValueError("%s: expected a list of bench records" % path)
        for i, r in enumerate(records):
            for field, kind in (("workload", str), ("atlas", (int, float)), ("unit", str)):
                if not isinstance(r, dict) or not isinstance(r.get(field), kind) or isinstance(r.get(field), bool):
                    raise ValueError("%s: record %d: field '%s' missing or of the wrong type" % (path, i, field))
        runs.append({"setting": setting, "records": records})
    extra = envcmp_file(logs, len(settings))
    if os.path.exists(extra):
        raise ValueError("%s: no ENV_CMP setting names it (%d given)" % (extra, len(settings)))
    return {"note": NOTE, "runs": runs}


def lines(doc):
    out = []
    for run in doc["runs"]:
        for r in run["records"]:
            d = r.get("detail", {})
            s = "%-44s %-18s %10.3f %-5s runs %s tokens %s" % (
                run["setting"], r["workload"], r["atlas"], r["unit"],
                " ".join("%.1f" % x for x in d.get("runs", [])), d.get("tokens_sha256", "-")[:8])
            if "first_token_s" in d:
                s += " | first ms %s | after %s" % (" ".join("%.2f" % (x * 1e3) for x in d["first_token_s"]),
                                                   " ".join("%.1f" % x for x in d.get("after_first_tok_s", [])))
            out.append(s)
    return out


def main(argv):
    if len(argv) != 4:
        print(__doc__.strip().split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    logs, env_cmp, out = argv[1:]
    try:
        doc = gather(logs, env_cmp)
    except ValueError as e:
        print("bench_records: " + str(e), file=sys.stderr)
        return 1
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, out)
    print("\n".join(lines(doc)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
