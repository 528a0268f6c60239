// Corpora: the four public sources of the seed experiments, read from the files as published,
// plus inline texts written in a protocol (authored prompts, the demo).
//
//   format      file                          source id                      prompt text
//   humaneval   HumanEval.jsonl.gz (gzip)     task_id                        prompt
//   gsm8k       test.jsonl                    0-based line index             question   (gold: number after ####)
//   tnews       CLUE json lines, or a member  "id" field, else the 0-based   sentence
//               of a zip (tnews_public.zip)   line index
//   wikitext    wiki.valid.raw                0-based line index             the line without '\n'
//   inline      texts = [...] in the protocol 0-based index                  the text
//
// Gold answers, tests and solutions never reach the model; only `text` is rendered.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace atlas::probe {

struct CorpusSpec {
  std::string domain;              // name used in cells and ranking ("gsm8k", "code", ...)
  std::string format;              // humaneval | gsm8k | tnews | wikitext | inline
  std::string path;                // resolved file path (empty for inline)
  std::string member;              // zip member (tnews from an archive); empty: plain file
  std::vector<std::string> texts;  // inline texts
};

struct Source {
  std::string domain;
  std::string source_id;    // stable id (see the table above)
  int64_t record = 0;       // 0-based record (line) index in the file
  std::string text;         // the only part allowed into the prompt
  std::string text_sha256;  // SHA-256 of text's UTF-8 bytes
  std::string gold;         // never rendered (GSM8K final number); empty if none
};

struct Corpus {
  CorpusSpec spec;
  std::string file_sha256;    // of the file as stored (the zip for a member); empty for inline
  std::string member_sha256;  // of the zip member's bytes; empty otherwise
  std::vector<Source> sources;  // file order
};

// Missing file, bad gzip/zip, malformed JSON or a record without the expected field ->
// atlas::Error naming the file (and member), the 1-based line and the field.
Corpus read_corpus(const CorpusSpec& spec);

// Known formats, for validating protocols.
bool is_corpus_format(const std::string& format);

// A WikiText heading line (" = Title = ", " = = Section = = ").
bool is_wikitext_heading(const std::string& line);

}  // namespace atlas::probe
