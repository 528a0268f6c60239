// Hugging Face tokenizers' own Rust core (0.22.2, through the @anush008/tokenizers napi build) as
// an oracle for atlas's tokenizer: the reference the issue names, runnable in CI without Python.
//
//   node hf.mjs encode DIR INPUT.jsonl [--special] [--field text]
//
// DIR holds tokenizer.json. One {"ids": [...], "offsets": [[start, end], ...]} line per input
// line; offsets as the Rust core reports them for a JavaScript caller (code points of the input).
// add_special_tokens follows --special and applies only tokenizer.json's post-processor
// (transformers' add_bos_token handling in Python is not part of the Rust core).
import { readFileSync, writeSync } from "node:fs";
import tk from "@anush008/tokenizers";

const [cmd, dir, file, ...rest] = process.argv.slice(2);
if (cmd !== "encode" || !dir || !file) {
  process.stderr.write("usage: node hf.mjs encode DIR INPUT.jsonl [--special] [--field F]\n");
  process.exit(2);
}
const special = rest.includes("--special");
const fi = rest.indexOf("--field");
const field = fi >= 0 ? rest[fi + 1] : "text";
const tok = tk.Tokenizer.fromFile(`${dir}/tokenizer.json`);
const lines = readFileSync(file, "utf8").split("\n").filter((l) => l.length > 0);
let out = "";
for (const line of lines) {
  const enc = await tok.encode(JSON.parse(line)[field], null, { addSpecialTokens: special });
  out += JSON.stringify({ ids: enc.getIds(), offsets: enc.getOffsets() }) + "\n";
  if (out.length > 1 << 20) {
    writeSync(1, out);
    out = "";
  }
}
writeSync(1, out);
