"""Probe harness end to end on the tiny checkpoint: freeze (selection, rendering, contracts),
run (trace and generate), journals and --resume, shards and merge, and bad input.

Independent checks: the ranking is recomputed here with hashlib, corpus records are read here
with gzip/json, edit ids come from `atlas tokenize`, and the causal control (an edit after the
target cannot change the target's routes) is a property of the model, not of the harness.
"""
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import warnings

warnings.simplefilter("ignore", ResourceWarning)

ATLAS = os.environ.get("ATLAS_BIN", "build/atlas")
SRC = os.environ.get("ATLAS_SOURCE_DIR", ".")
DATA = os.path.normpath(os.path.join(SRC, "..", "shared", "data"))
if not os.path.isdir(DATA):
    DATA = "/work/shared/data"
HAVE_DATA = os.path.isdir(DATA)

TMP = tempfile.mkdtemp(prefix="atlas-probe-")
MODEL = os.path.join(TMP, "tiny")


def atlas(*args, rc=0, env=None):
    e = dict(os.environ)
    e.pop("ATLAS_PROGRESS", None)
    e.pop("ATLAS_PROBE_ABORT_AFTER_SOURCES", None)
    # One thread: the tiny model is too small to gain from more, and OpenMP spinning on a busy
    # 2-core machine costs seconds per call. Results never depend on it (one run below uses 2).
    e["OMP_NUM_THREADS"] = "1"
    if env:
        e.update(env)
    p = subprocess.run([ATLAS, *args], capture_output=True, text=True, env=e)
    if rc is not None and p.returncode != rc:
        raise AssertionError(f"atlas {' '.join(args)}: rc {p.returncode} (want {rc})\n{p.stdout}\n{p.stderr}")
    return p


def token_ids(text):
    out = atlas("tokenize", "--model", MODEL, "--text", text).stdout
    return json.loads(out.strip().splitlines()[-1])["ids"]


def load(path):
    with open(path) as f:
        return json.load(f)


def stage_hash(data, H):
    """docs/trace.md "Stage hashes": SHA-256 over the per-token SHA-256 digests of float32 rows."""
    row = 4 * H
    assert len(data) % row == 0
    return hashlib.sha256(b"".join(hashlib.sha256(data[i:i + row]).digest()
                                   for i in range(0, len(data), row))).hexdigest()


def content(artifact):
    a = dict(artifact)
    a.pop("runtime")
    return a


PROTO = """
[protocol]
name = "test-family"

[model]
dir = "{model}"

[[corpus]]
domain = "english"
format = "inline"
texts = ["The quick brown fox jumps over the lazy dog.", "Routing probes change one token.",
         "Experts receive tokens.", "A fourth text for ranking."]

[[corpus]]
domain = "code"
format = "inline"
texts = ["def add(a, b):\\n    return a + b\\n", "print(1 + 2)\\n", "x = [i * i for i in range(4)]\\n"]

[selection]
salt = "test-salt"
per_domain = 2

[blocks]
system = "You are a careful assistant."
filler_token = "x"
filler_repeat = 3

[[condition]]
name = "s0_eos"
history = "filler"
group = "s0"

[[condition]]
name = "s0_bos"
history = "filler"
group = "s0"
edits = [{{ anchor = "history_eos", to = "<bos>" }}]

[[condition]]
name = "s0_period"
history = "filler"
group = "s0"
edits = [{{ anchor = "history_eos", to = "." }}]

[[condition]]
name = "s0_post"
history = "filler"
group = "s0"
edits = [{{ anchor = "gen_role_head", to = "x" }}]

[[condition]]
name = "s1_eos"
system = true
history = "filler"
group = "s1"

[[condition]]
name = "s1_block"
system = true
history = "filler"
group = "s1"
edits = [{{ anchor = "target_role_head", to_anchor = "gen_role_head" }}, {{ anchor = "target_role_delim", to = "x" }}]

[execution]
mode = "{mode}"
layers = "{layers}"
{execution}

[batching]
sources_per_batch = {spb}
{batching}
"""


def write_proto(name, mode="trace", layers="", execution="", spb=2, batching="", **repl):
    text = PROTO.format(model=MODEL, mode=mode, layers=layers, execution=execution, spb=spb, batching=batching)
    for k, v in repl.items():
        text = text.replace(k, v)
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def setUpModule():
    atlas("make-model", "--preset", "tiny", "--seed", "0", MODEL)


def tearDownModule():
    shutil.rmtree(TMP, ignore_errors=True)


class Freeze(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.proto = write_proto("family.toml")
        cls.manifest_path = os.path.join(TMP, "family.json")
        atlas("freeze", cls.proto, "--out", cls.manifest_path)
        cls.m = load(cls.manifest_path)

    def test_counts_and_edits(self):
        m = self.m
        self.assertEqual(len(m["sources"]), 4)
        self.assertEqual(len(m["cells"]), 4 * 6)
        want_edits = {"s0_eos": 0, "s0_bos": 1, "s0_period": 1, "s0_post": 1, "s1_eos": 0, "s1_block": 2}
        for c in m["cells"]:
            self.assertEqual(len(c["edits"]), want_edits[c["condition"]], c["cell_id"])
            self.assertEqual(c["n_tokens"], len(c["input_ids"]))
        self.assertEqual(m["contracts"]["cells_by_edit_count"], {"0": 8, "1": 12, "2": 4})

    def test_edit_ids_come_from_the_tokenizer(self):
        bos, eos, period, x = 1000, 1001, token_ids(".")[0], token_ids("x")[0]
        self.assertEqual(token_ids("."), [period])
        for c in self.m["cells"]:
            for e in c["edits"]:
                self.assertEqual(c["input_ids"][e["position"]], e["new_id"])
                self.assertNotEqual(e["official_id"], e["new_id"])
            if c["condition"] == "s0_bos":
                self.assertEqual(c["edits"][0]["official_id"], eos)
                self.assertEqual(c["edits"][0]["new_id"], bos)
            if c["condition"] == "s0_period":
                self.assertEqual(c["edits"][0]["new_id"], period)
            if c["condition"] == "s0_post":
                self.assertEqual(c["edits"][0]["new_id"], x)

    def test_official_rendering_matches_the_template_and_edits_differ_exactly(self):
        # The official cell's ids are the tokenization of `atlas render`'s chat-template output.
        by = {(c["source_key"], c["condition"]): c for c in self.m["cells"]}
        for src in self.m["sources"]:
            text = src["contents"][0]["text"]
            msgs = [{"role": "user", "content": "x x x"}, {"role": "assistant", "content": "x"},
                    {"role": "user", "content": text}]
            case = os.path.join(TMP, "case.jsonl")
            with open(case, "w") as f:
                f.write(json.dumps({"messages": msgs, "add_generation_prompt": True}) + "\n")
            rendered = json.loads(atlas("render", "--model", MODEL, "--messages-jsonl", case).stdout)
            official = by[(src["key"], "s0_eos")]
            self.assertEqual(token_ids(rendered), official["input_ids"])
            self.assertEqual(hashlib.sha256(rendered.encode()).hexdigest(), official["rendered_text_sha256"])
            for cond in ("s0_bos", "s0_period", "s0_post"):
                c = by[(src["key"], cond)]
                diff = [i for i, (a, b) in enumerate(zip(c["input_ids"], official["input_ids"])) if a != b]
                self.assertEqual(diff, [e["position"] for e in c["edits"]])
                self.assertEqual(len(c["input_ids"]), len(official["input_ids"]))
                self.assertEqual(c["interior_token_range"], official["interior_token_range"])

    def test_interior_tokens_lie_inside_the_target_content(self):
        srcs = {s["key"]: s for s in self.m["sources"]}
        for c in self.m["cells"]:
            a, b = c["interior_token_range"]
            self.assertLess(a, b)
            inner = atlas("detokenize", "--model", MODEL, "--ids", ",".join(map(str, c["input_ids"][a:b]))).stdout[:-1]
            target = srcs[c["source_key"]]["contents"][0]["text"]
            self.assertIn(inner, target, c["cell_id"])
            # The tokens just outside the interior are not wholly inside the content.
            outer = atlas("detokenize", "--model", MODEL, "--ids", ",".join(map(str, c["input_ids"][a - 1:b + 1]))).stdout[:-1]
            self.assertNotIn(outer, target, c["cell_id"])
            self.assertEqual(c["target_span"][1] - c["target_span"][0], len(target))

    def test_ranking_is_sha256_of_salt_domain_id(self):
        texts = {"english": 4, "code": 3}
        for domain, n in texts.items():
            ranked = sorted((hashlib.sha256(b"test-salt\0" + domain.encode() + b"\0" + str(i).encode()).hexdigest(), str(i))
                            for i in range(n))
            got = [s["source_id"] for s in self.m["sources"] if s["domain"] == domain]
            self.assertEqual(got, [i for _, i in ranked[:2]])
            got_hash = [s["rank_sha256"] for s in self.m["sources"] if s["domain"] == domain]
            self.assertEqual(got_hash, [h for h, _ in ranked[:2]])

    def test_manifest_hash_and_determinism(self):
        m = dict(self.m)
        h = m.pop("manifest_sha256")
        ordered = json.loads(open(self.manifest_path).read(), object_pairs_hook=lambda kv: dict(kv))
        ordered.pop("manifest_sha256")
        self.assertEqual(hashlib.sha256(json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest(), h)
        again = os.path.join(TMP, "family2.json")
        atlas("freeze", self.proto, "--out", again)
        self.assertEqual(open(again, "rb").read(), open(self.manifest_path, "rb").read())


    def test_reference_selection_takes_the_sources_of_another_manifest(self):
        # seed-system.md 2.4, chat reuse: another salt would rank other sources; the reference
        # gives this manifest's ids, ranks, rank hashes and order (its first k per domain).
        for k, how in ((2, "protocol"), (1, "flag")):
            text = open(self.proto).read().replace('salt = "test-salt"', 'salt = "another-salt"')
            if how == "protocol":
                text = text.replace("per_domain = 2", f'per_domain = {k}\nreference = "{self.manifest_path}"')
            else:
                text = text.replace("per_domain = 2", f"per_domain = {k}")
            proto = os.path.join(TMP, f"reuse{k}.toml")
            open(proto, "w").write(text)
            out = os.path.join(TMP, f"reuse{k}.json")
            extra = () if how == "protocol" else ("--reference-selection", self.manifest_path)
            atlas("freeze", proto, "--out", out, *extra)
            m = load(out)
            keep = ("domain", "source_id", "rank", "rank_sha256", "text_sha256")
            want = [{f: s[f] for f in keep} for s in self.m["sources"] if s["rank"] < k]
            self.assertEqual([{f: s[f] for f in keep} for s in m["sources"]], want)
            for sel in m["selection"]:
                self.assertEqual(sel["reference"]["manifest_sha256"], self.m["manifest_sha256"])
                self.assertEqual(sel["selected"], k)
            self.assertEqual(m["protocol"]["selection"]["reference"], self.manifest_path)
        # Without a reference the other salt ranks other sources (so the test above can fail).
        plain = os.path.join(TMP, "reuse-plain.toml")
        open(plain, "w").write(open(self.proto).read().replace('salt = "test-salt"', 'salt = "another-salt"'))
        atlas("freeze", plain, "--out", os.path.join(TMP, "reuse-plain.json"))
        self.assertNotEqual([s["source_id"] for s in load(os.path.join(TMP, "reuse-plain.json"))["sources"]],
                            [s["source_id"] for s in self.m["sources"]])
        self.assertNotIn("reference", load(os.path.join(TMP, "reuse-plain.json"))["protocol"]["selection"])

    def test_reference_selection_refusals(self):
        out = os.path.join(TMP, "reuse-bad.json")

        def fails(proto_text, *needles, ref=None):
            proto = os.path.join(TMP, "reuse-bad.toml")
            open(proto, "w").write(proto_text)
            p = atlas("freeze", proto, "--out", out, "--reference-selection", ref or self.manifest_path, rc=1)
            for n in needles:
                self.assertIn(n, p.stderr)
            self.assertFalse(os.path.exists(out))

        base = open(self.proto).read()
        fails(base.replace("per_domain = 2", "per_domain = 3"), "family.json", 'domain "english"',
              "the reference has 2, the protocol asks for 3")
        # A source's text changed since the reference was frozen: the id alone is not enough.
        fails(base.replace("The quick brown fox", "The slow brown fox").replace("Routing probes", "Routing tests")
              .replace("Experts receive", "Experts get").replace("A fourth text", "A 4th text"),
              "family.json", "source ", "hashes to", "the reference recorded")
        # A reference edited after freezing, and a file that is no manifest.
        m = json.loads(open(self.manifest_path).read())
        m["sources"][0]["rank"] = 1
        edited = os.path.join(TMP, "edited-ref.json")
        open(edited, "w").write(json.dumps(m))
        fails(base, "edited-ref.json", "manifest_sha256", ref=edited)
        notm = os.path.join(TMP, "not-a-manifest.json")
        open(notm, "w").write('{"kind": "atlas.run"}')
        fails(base, "not-a-manifest.json", "kind", ref=notm)
        fails(base, "nowhere.json", ref=os.path.join(TMP, "nowhere.json"))


class Run(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.proto = write_proto("run.toml")
        cls.manifest = os.path.join(TMP, "run.json")
        atlas("freeze", cls.proto, "--out", cls.manifest)
        cls.m = load(cls.manifest)
        cls.full = os.path.join(TMP, "run-full")
        atlas("run", cls.manifest, "--out", cls.full)
        cls.a = load(os.path.join(cls.full, "run.json"))

    def test_artifact_shape(self):
        a = self.a
        self.assertEqual(a["manifest_sha256"], self.m["manifest_sha256"])
        self.assertEqual(len(a["cells"]), len(self.m["cells"]))
        moe_layers = [g["layer"] for g in a["cells"][0]["result"]["gates"]]
        self.assertTrue(moe_layers)
        for c in a["cells"]:
            r = c["result"]
            self.assertEqual([x["layer"] for x in r["routes"]], moe_layers)
            for route in r["routes"]:
                self.assertEqual(len(route["topk_ids"]), c["n_tokens"])
                for ids, w in zip(route["topk_ids"], route["topk_weights"]):
                    self.assertEqual(len(set(ids)), len(ids))
                    self.assertEqual(len(ids), len(w))
            self.assertEqual(r["stages"][0]["name"], "embed")
            self.assertEqual(r["stages"][-1]["name"], "final_norm")
        self.assertEqual(len(os.listdir(os.path.join(self.full, "journal"))), 4)

    def test_causal_controls(self):
        by = {(c["source_key"], c["condition"]): c for c in self.a["cells"]}
        for c in self.a["cells"]:
            if not c["edits"]:
                continue
            ref = by[(c["source_key"], "s0_eos" if c["group"] == "s0" else "s1_eos")]
            first = min(e["position"] for e in c["edits"])
            # Tokens before the first edit see identical inputs: routes and embeddings must match.
            for r1, r2 in zip(c["result"]["routes"], ref["result"]["routes"]):
                self.assertEqual(r1["topk_ids"][:first], r2["topk_ids"][:first], c["cell_id"])
                self.assertEqual(r1["topk_weights"][:first], r2["topk_weights"][:first], c["cell_id"])
            if c["condition"] == "s0_post":
                # The post-target edit is after the whole target: target routes and hashes are exact.
                for g1, g2 in zip(c["result"]["gates"], ref["result"]["gates"]):
                    self.assertEqual(g1["target_ids_sha256"], g2["target_ids_sha256"])
                for s1, s2 in zip(c["result"]["stages"], ref["result"]["stages"]):
                    self.assertEqual(s1["target_sha256"], s2["target_sha256"])
            else:
                # An edit before the target changes something downstream in a random model.
                self.assertNotEqual([s["target_sha256"] for s in c["result"]["stages"][1:]],
                                    [s["target_sha256"] for s in ref["result"]["stages"][1:]], c["cell_id"])

    def test_rerun_is_byte_identical_and_batch_independent(self):
        again = os.path.join(TMP, "run-again")
        p = atlas("run", self.manifest, "--out", again, "--threads", "2",
                  env={"ATLAS_PROGRESS": "1", "OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"})
        n = len(self.m["cells"])
        self.assertIn(f"run: cells {n}/{n}", p.stderr)
        self.assertIn("tok/s", p.stderr)
        self.assertIn("ETA", p.stderr)
        self.assertEqual(content(load(os.path.join(again, "run.json"))), content(self.a))
        # Other batch shapes (one source per batch) give the same per-cell results.
        proto = write_proto("run-spb1.toml", spb=1)
        man = os.path.join(TMP, "run-spb1.json")
        atlas("freeze", proto, "--out", man)
        d = os.path.join(TMP, "run-spb1")
        atlas("run", man, "--out", d)
        b = load(os.path.join(d, "run.json"))
        self.assertEqual([c["result"] for c in b["cells"]], [c["result"] for c in self.a["cells"]])

    def test_killed_and_resumed_equals_uninterrupted(self):
        d = os.path.join(TMP, "run-killed")
        p = atlas("run", self.manifest, "--out", d, rc=3, env={"ATLAS_PROBE_ABORT_AFTER_SOURCES": "2"})
        self.assertFalse(os.path.exists(os.path.join(d, "run.json")))
        self.assertEqual(len(os.listdir(os.path.join(d, "journal"))), 2)
        # Without --resume the journals are not silently overwritten.
        p = atlas("run", self.manifest, "--out", d, rc=1)
        self.assertIn("--resume", p.stderr)
        p = atlas("run", self.manifest, "--out", d, "--resume")
        self.assertIn("resumed", p.stdout)
        a = load(os.path.join(d, "run.json"))
        self.assertEqual(content(a), content(self.a))
        self.assertEqual(a["runtime"]["cells_resumed"], 12)
        # Resuming a complete run reruns nothing and still gives the same artifact.
        atlas("run", self.manifest, "--out", d, "--resume")
        self.assertEqual(content(load(os.path.join(d, "run.json"))), content(self.a))

    def test_sigkill_then_resume_equals_uninterrupted(self):
        import signal
        import time
        texts = ", ".join(f'"Sentence number {i} about routing and experts."' for i in range(24))
        proto = write_proto("kill.toml", spb=1, **{'texts = ["The quick brown fox jumps over the lazy dog.", "Routing probes change one token.",\n         "Experts receive tokens.", "A fourth text for ranking."]': f"texts = [{texts}]",
                                                   "per_domain = 2": "per_domain = 3"})
        text = open(proto).read().replace("per_domain = 3", "per_domain = 24")
        # Only the english domain: drop the code corpus.
        a, b = text.index('[[corpus]]\ndomain = "code"'), text.index("[selection]")
        open(proto, "w").write(text[:a] + text[b:])
        man = os.path.join(TMP, "kill.json")
        atlas("freeze", proto, "--out", man)
        ref = os.path.join(TMP, "kill-ref")
        atlas("run", man, "--out", ref)
        d = os.path.join(TMP, "kill-run")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        p = subprocess.Popen([ATLAS, "run", man, "--out", d], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        jdir = os.path.join(d, "journal")
        deadline = time.time() + 30
        while time.time() < deadline and p.poll() is None:
            if os.path.isdir(jdir) and any(f.endswith(".jsonl") for f in os.listdir(jdir)):
                p.send_signal(signal.SIGKILL)
                break
            time.sleep(0.001)
        p.wait()
        if p.returncode != -signal.SIGKILL:
            self.skipTest("the run finished before it could be killed")
        self.assertFalse(os.path.exists(os.path.join(d, "run.json")))
        done = [f for f in os.listdir(jdir) if f.endswith(".jsonl")]
        self.assertLess(len(done), 24)
        atlas("run", man, "--out", d, "--resume")
        self.assertEqual(content(load(os.path.join(d, "run.json"))), content(load(os.path.join(ref, "run.json"))))

    def test_tampered_journal_and_other_manifest_are_refused(self):
        d = os.path.join(TMP, "run-tamper")
        shutil.copytree(self.full, d)
        j = os.path.join(d, "journal", sorted(os.listdir(os.path.join(d, "journal")))[0])
        lines = open(j).read().splitlines()
        lines[1] = lines[1].replace('"topk_ids":[[', '"topk_ids":[[0,', 1) if '"topk_ids":[[' in lines[1] else lines[1][:-5] + "0" + lines[1][-4:]
        open(j, "w").write("\n".join(lines) + "\n")
        p = atlas("run", self.manifest, "--out", d, "--resume", rc=1)
        self.assertIn(os.path.basename(j), p.stderr)
        self.assertIn("hash", p.stderr)
        # A manifest with other contents (here: one source per domain) must refuse these journals.
        other = os.path.join(TMP, "run-other.json")
        atlas("freeze", self.proto, "--out", other, "--per-domain", "1")
        p = atlas("run", other, "--out", self.full, "--resume", rc=1)
        self.assertIn("another manifest", p.stderr)

    def test_shards_and_merge(self):
        s0, s1 = os.path.join(TMP, "shard0"), os.path.join(TMP, "shard1")
        atlas("run", self.manifest, "--out", s0, "--shard", "0/2")
        atlas("run", self.manifest, "--out", s1, "--shard", "1/2")
        n0 = len(load(os.path.join(s0, "run.json"))["cells"])
        n1 = len(load(os.path.join(s1, "run.json"))["cells"])
        self.assertEqual(n0 + n1, len(self.m["cells"]))
        self.assertGreater(n0, 0)
        self.assertGreater(n1, 0)
        merged = os.path.join(TMP, "merged")
        atlas("merge", self.manifest, s0, s1, "--out", merged)
        self.assertEqual(content(load(os.path.join(merged, "run.json"))), content(self.a))
        p = atlas("merge", self.manifest, s0, "--out", os.path.join(TMP, "merged-missing"), rc=1)
        self.assertIn("missing", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(TMP, "merged-missing", "run.json")))
        p = atlas("merge", self.manifest, s0, s0, "--out", os.path.join(TMP, "merged-double"), rc=1)
        self.assertIn("twice", p.stderr)
        for bad in ("2/2", "-1/2", "1", "a/b", "0/0"):
            d = os.path.join(TMP, "bad-shard")
            p = atlas("run", self.manifest, "--out", d, "--shard", bad, rc=1)
            self.assertIn("--shard", p.stderr)
            self.assertFalse(os.path.exists(d))


class HiddenVectors(unittest.TestCase):
    def test_resume_checks_the_journaled_side_files(self):
        # A killed vector run's journaled sources are reused only with their side files whole:
        # a flipped byte, a swapped file or a missing one is refused by --resume, naming the file.
        proto = write_proto("vec-resume.toml", execution="record_hidden_vectors = true")
        man = os.path.join(TMP, "vec-resume.json")
        atlas("freeze", proto, "--out", man)
        full = os.path.join(TMP, "vec-resume-full")
        atlas("run", man, "--out", full)
        d = os.path.join(TMP, "vec-resume-killed")
        atlas("run", man, "--out", d, rc=3, env={"ATLAS_PROBE_ABORT_AFTER_SOURCES": "2"})
        hdir = os.path.join(d, "hidden")
        files = sorted(os.listdir(hdir))
        self.assertEqual(len(files), 2)
        first, second = (os.path.join(hdir, f) for f in files)
        keep = open(first, "rb").read()
        flipped = bytearray(keep)
        flipped[-3] ^= 0x40  # a float of the last tensor's rows
        open(first, "wb").write(bytes(flipped))
        p = atlas("run", man, "--out", d, "--resume", rc=1)
        self.assertIn(files[0], p.stderr)
        self.assertIn("does not hash to the stage's target_sha256", p.stderr)
        open(first, "wb").write(open(second, "rb").read())  # another source's file
        p = atlas("run", man, "--out", d, "--resume", rc=1)
        self.assertIn(files[0], p.stderr)
        self.assertIn("__metadata__", p.stderr)
        os.remove(first)
        p = atlas("run", man, "--out", d, "--resume", rc=1)
        self.assertIn("journaled source without its hidden-vector file", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(d, "run.json")))
        # Restored, the resume completes the run as the uninterrupted one.
        open(first, "wb").write(keep)
        atlas("run", man, "--out", d, "--resume")
        self.assertEqual(content(load(os.path.join(d, "run.json"))), content(load(os.path.join(full, "run.json"))))
        for f in os.listdir(os.path.join(full, "hidden")):
            self.assertEqual(open(os.path.join(hdir, f), "rb").read(), open(os.path.join(full, "hidden", f), "rb").read())
        # Rows without stage hashes could not be checked: the protocol refuses them.
        bad = write_proto("vec-nohash.toml", execution="record_hidden_vectors = true\nrecord_hidden = false")
        p = atlas("freeze", bad, "--out", os.path.join(TMP, "vec-nohash.json"), rc=1)
        self.assertIn("record_hidden_vectors", p.stderr)
        self.assertIn("needs record_hidden = true", p.stderr)

    def test_side_file_holds_the_hashed_target_rows(self):
        import struct
        proto = write_proto("vec.toml", execution="record_hidden_vectors = true\nrecord_routes = false")
        man = os.path.join(TMP, "vec.json")
        atlas("freeze", proto, "--out", man)
        d = os.path.join(TMP, "vec-run")
        atlas("run", man, "--out", d)
        a = load(os.path.join(d, "run.json"))
        files = sorted(os.listdir(os.path.join(d, "hidden")))
        self.assertEqual(len(files), 4)
        tensors = {}
        for f in files:
            raw = open(os.path.join(d, "hidden", f), "rb").read()
            n = struct.unpack("<Q", raw[:8])[0]
            header = json.loads(raw[8:8 + n])
            self.assertEqual(header["__metadata__"]["manifest_sha256"], a["manifest_sha256"])
            for name, t in header.items():
                if name != "__metadata__":
                    b0, b1 = t["data_offsets"]
                    tensors[name] = (t["shape"], raw[8 + n + b0:8 + n + b1])
        for c in a["cells"]:
            prefix = c["result"]["hidden_vectors"]["tensor_prefix"]
            a0, a1 = c["interior_token_range"]
            for st in c["result"]["stages"]:
                shape, data = tensors[prefix + st["name"]]
                self.assertEqual(shape[0], a1 - a0)
                self.assertEqual(stage_hash(data, shape[1]), st["target_sha256"])

        # full_sha256 from outside the run: `atlas trace` of one cell's ids alone (the CPU rows
        # are batch invariant), its dumped hidden tensors hashed here.
        c = a["cells"][1]
        dump = os.path.join(TMP, "vec-cell.safetensors")
        summary = os.path.join(TMP, "vec-cell.json")
        atlas("trace", "--model", MODEL, "--ids", ",".join(map(str, c["input_ids"])),
              "--compute", a["execution"]["compute"], "--dump", dump, "--json", summary)
        raw = open(dump, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        traced = {s["stage"]: s["sha256"] for s in load(summary)["stages"]}
        a0, a1 = c["interior_token_range"]
        for st in c["result"]["stages"]:
            t = header["hidden.%d" % st["stage"]]
            b0, b1 = t["data_offsets"]
            data = raw[8 + n + b0:8 + n + b1]
            H = t["shape"][1]
            self.assertEqual(t["shape"][0], c["n_tokens"])
            self.assertEqual(stage_hash(data, H), st["full_sha256"], st["name"])
            self.assertEqual(stage_hash(data[a0 * 4 * H:a1 * 4 * H], H), st["target_sha256"], st["name"])
            self.assertEqual(traced[st["stage"]], st["full_sha256"], st["name"])


class Generate(unittest.TestCase):
    def test_greedy_and_seeded(self):
        proto = write_proto("gen.toml", mode="generate", execution='max_new_tokens = 3\nsampling = "seeded"\n'
                            'temperature = 0.7\ntop_p = 0.9\n[[execution.seed]]\nvalue = 7\n[[execution.seed]]\nvalue = 8\n'
                            'sources_per_domain = 1\n', batching="split_seeds = true")
        man = os.path.join(TMP, "gen.json")
        atlas("freeze", proto, "--out", man)
        m = load(man)
        self.assertEqual(len(m["cells"]), 4 * 6 + 2 * 6)  # seed 7: all sources; seed 8: first per domain
        d = os.path.join(TMP, "gen-run")
        atlas("run", man, "--out", d)
        a = load(os.path.join(d, "run.json"))
        for c in a["cells"]:
            r = c["result"]
            self.assertEqual(r["n_new"], len(r["generated_ids"]))
            self.assertLessEqual(r["n_new"], 3)
            self.assertIn(r["stop"], ("eos", "length"))
            self.assertEqual(r["sampling"]["seed"], c["seed"])
            self.assertTrue(r["rng_state_sha256"])
        d2 = os.path.join(TMP, "gen-run2")
        atlas("run", man, "--out", d2, "--shard", "0/1")
        b = load(os.path.join(d2, "run.json"))
        self.assertEqual([c["result"] for c in b["cells"]], [c["result"] for c in a["cells"]])


class Demo(unittest.TestCase):
    def test_demo_end_to_end_and_repeatable(self):
        d = os.path.join(TMP, "demo")
        first = atlas("demo", "--out", d).stdout
        self.assertIn("making the tiny checkpoint", first)
        self.assertIn("contracts verified", first)
        a = load(os.path.join(d, "run", "run.json"))
        self.assertEqual(len(a["cells"]), 32)
        self.assertIn(a["content_sha256"], first)
        second = atlas("demo", "--out", d).stdout
        self.assertNotIn("making the tiny checkpoint", second)
        self.assertEqual(content(load(os.path.join(d, "run", "run.json"))), content(a))
        # The official rows are identical to themselves, so their line reads 100%.
        self.assertRegex(second, r"s0_eos +(\d+) / \1 +100.00%")


class BadInput(unittest.TestCase):
    def freeze_fails(self, proto, *needles, extra=()):
        out = os.path.join(TMP, "bad.json")
        p = atlas("freeze", proto, "--out", out, *extra, rc=1)
        for n in needles:
            self.assertIn(n, p.stderr)
        self.assertFalse(os.path.exists(out))
        return p

    def test_unknown_anchor(self):
        proto = write_proto("bad-anchor.toml", **{'anchor = "history_eos", to = "."': 'anchor = "nowhere", to = "."'})
        self.freeze_fails(proto, "bad-anchor.toml", "nowhere")

    def test_edit_that_breaks_a_contract(self):
        proto = write_proto("bad-noop.toml", **{'to = "<bos>"': 'to = "<eos>"'})
        self.freeze_fails(proto, "cell ", "s0_bos", "contract")
        proto = write_proto("bad-multitoken.toml", **{'to = "."': 'to = "xyzzy plugh"'})
        self.freeze_fails(proto, "s0_period", "exactly one token")
        # A one-token edit in a group with an unedited longer condition: unequal length.
        proto = write_proto("bad-group.toml", **{'name = "s1_eos"\nsystem = true\nhistory = "filler"\ngroup = "s1"':
                                                'name = "s1_eos"\nsystem = true\nhistory = "filler"\ngroup = "s0"'})
        self.freeze_fails(proto, "s1_eos", "equal length")
        # The anchor is missing in a condition without history.
        proto = write_proto("bad-missing.toml", **{'name = "s0_bos"\nhistory = "filler"': 'name = "s0_bos"\nhistory = "none"'})
        self.freeze_fails(proto, "s0_bos", "history_eos")

    def test_unknown_key_and_value(self):
        self.freeze_fails(write_proto("bad-key.toml", **{"[batching]": "[batching]\nbogus = 1"}), "batching.bogus")
        self.freeze_fails(write_proto("bad-mode.toml", mode="replay"), "execution.mode", "replay")

    @unittest.skipUnless(HAVE_DATA, "shared data absent")
    def test_missing_corpus_and_field(self):
        src = os.path.join(TMP, "corpora")
        os.makedirs(src, exist_ok=True)
        with open(os.path.join(src, "gsm.jsonl"), "w") as f:
            f.write(json.dumps({"question": "1+1?", "answer": "2 #### 2"}) + "\n")
            f.write(json.dumps({"question": "2+2?", "answer": "4 #### 4"}) + "\n")
            f.write(json.dumps({"q": "3+3?", "answer": "6 #### 6"}) + "\n")
        corpus = '[[corpus]]\ndomain = "gsm8k"\npath = "gsm.jsonl"\n'
        base = write_proto("bad-field.toml")
        text = open(base).read()
        start = text.index("[[corpus]]")
        end = text.index("[selection]")
        text = text[:start] + corpus + "\n" + text[end:]
        for name, path in (("bad-field.toml", "gsm.jsonl"), ("bad-missing-corpus.toml", "nope.jsonl")):
            p = os.path.join(TMP, name)
            open(p, "w").write(text.replace("gsm.jsonl", path))
            if path == "gsm.jsonl":
                self.freeze_fails(p, "gsm.jsonl:3", "question", extra=("--data", src))
            else:
                self.freeze_fails(p, "nope.jsonl", "not found", extra=("--data", src))

    def test_layer_range_beyond_the_model(self):
        # Freezing checks a trace's range against the model's config (the tiny model: layers 0-3).
        self.freeze_fails(write_proto("bad-layers.toml", layers="0-9"), "bad-layers.toml", "execution.layers",
                          "outside 0-3")
        # A model directory without config.json cannot be checked when freezing; the run checks
        # it against the model it is given before writing anything: no journal directory left.
        bare = os.path.join(TMP, "tiny-noconfig")
        shutil.rmtree(bare, ignore_errors=True)
        shutil.copytree(MODEL, bare)
        os.remove(os.path.join(bare, "config.json"))
        man = os.path.join(TMP, "layers.json")
        atlas("freeze", write_proto("layers.toml", layers="0-9"), "--out", man, "--model", bare)
        d = os.path.join(TMP, "layers-run")
        p = atlas("run", man, "--out", d, "--model", MODEL, rc=1)
        self.assertIn("protocol.execution.layers", p.stderr)
        self.assertIn("outside 0-3", p.stderr)
        self.assertFalse(os.path.exists(d))

    def test_modified_manifest_is_refused(self):
        proto = write_proto("mod.toml")
        man = os.path.join(TMP, "mod.json")
        atlas("freeze", proto, "--out", man)
        m = json.loads(open(man).read())
        m["cells"][0]["input_ids"][1] = 5
        open(man, "w").write(json.dumps(m))
        d = os.path.join(TMP, "mod-run")
        p = atlas("run", man, "--out", d, rc=1)
        self.assertIn("manifest_sha256", p.stderr)
        self.assertFalse(os.path.exists(d))


@unittest.skipUnless(HAVE_DATA, "shared data absent")
class Corpora(unittest.TestCase):
    """The readers against the published files, read independently here."""

    def freeze_domain(self, corpus, per=3, extra_sel=""):
        proto = write_proto("corpus.toml")
        text = open(proto).read()
        start, end = text.index("[[corpus]]"), text.index("[selection]")
        text = text[:start] + corpus + "\n" + text[end:].replace('salt = "test-salt"', 'salt = "test-salt"\n' + extra_sel)
        # Raw conditions only: no anchors needed.
        text = text[:text.index("[[condition]]")] + '[[condition]]\nname = "raw"\nlayout = "raw"\n' + text[text.index("[execution]"):]
        open(proto, "w").write(text)
        man = os.path.join(TMP, "corpus.json")
        atlas("freeze", proto, "--out", man, "--data", DATA, "--per-domain", str(per))
        return load(man)

    def test_humaneval(self):
        m = self.freeze_domain('[[corpus]]\ndomain = "humaneval"\npath = "humaneval/HumanEval.jsonl.gz"\n')
        recs = {r["task_id"]: r for r in map(json.loads, gzip.open(os.path.join(DATA, "humaneval/HumanEval.jsonl.gz"), "rt"))}
        self.assertEqual(m["corpora"][0]["records"], 164)
        for s in m["sources"]:
            self.assertEqual(s["text_sha256"], hashlib.sha256(recs[s["source_id"]]["prompt"].encode()).hexdigest())

    def test_gsm8k_gold_and_truncation(self):
        m = self.freeze_domain('[[corpus]]\ndomain = "gsm8k"\npath = "gsm8k/test.jsonl"\n',
                               extra_sel="content_tokens = [16, 24]\nmin_tokens = 24")
        lines = open(os.path.join(DATA, "gsm8k/test.jsonl")).read().splitlines()
        for s in m["sources"]:
            r = json.loads(lines[int(s["source_id"])])
            self.assertEqual(s["text_sha256"], hashlib.sha256(r["question"].encode()).hexdigest())
            self.assertEqual(s["gold"], r["answer"].split("####")[-1].strip())
            self.assertGreaterEqual(s["n_tokens"], 24)
            short, long_ = s["contents"]
            self.assertEqual((short["n_tokens"], long_["n_tokens"]), (16, 24))
            self.assertTrue(long_["text"].startswith(short["text"]))
        cells = {(c["source_key"], c["content_tokens"]): c for c in m["cells"]}
        for s in m["sources"]:
            a, b = cells[(s["key"], 16)]["input_ids"], cells[(s["key"], 24)]["input_ids"]
            self.assertEqual(b[:len(a)], a)
            self.assertEqual(len(a), 17)

    def test_tnews_file_and_zip(self):
        m = self.freeze_domain('[[corpus]]\ndomain = "tnews"\npath = "tnews/fewclue/test_public.json"\n')
        lines = open(os.path.join(DATA, "tnews/fewclue/test_public.json"), encoding="utf-8").read().splitlines()
        by_id = {str(json.loads(l)["id"]): json.loads(l) for l in lines if l.strip()}
        for s in m["sources"]:
            self.assertEqual(s["text_sha256"], hashlib.sha256(by_id[s["source_id"]]["sentence"].encode()).hexdigest())
        z = self.freeze_domain('[[corpus]]\ndomain = "tnews"\npath = "tnews/tnews_public_repack.zip"\nmember = "tnews_public/test.json"\n')
        self.assertEqual(z["corpora"][0]["member_sha256"], "0dd33323dfdf224a690f684746b00048a46b70f3b244d411293c8470572644ef")
        self.assertEqual(z["corpora"][0]["records"], 10000)

    def test_wikitext_skips_blank_and_headings(self):
        m = self.freeze_domain('[[corpus]]\ndomain = "wikitext"\npath = "wikitext2/wiki.valid.raw"\n', per=8)
        lines = open(os.path.join(DATA, "wikitext2/wiki.valid.raw"), encoding="utf-8").read().split("\n")
        self.assertEqual(m["corpora"][0]["records"], 3760)
        for s in m["sources"]:
            line = lines[int(s["source_id"])]
            self.assertTrue(line.strip())
            self.assertFalse(line.strip().startswith("= ") and line.strip().endswith(" ="))
            self.assertEqual(s["text_sha256"], hashlib.sha256(line.encode()).hexdigest())
        sel = m["selection"][0]
        self.assertEqual(sel["considered"], 8 + sum(sel["excluded"].values()))


if __name__ == "__main__":
    unittest.main(verbosity=1)
