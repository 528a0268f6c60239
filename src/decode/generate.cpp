#include "decode/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "core/error.h"
#include "core/progress.h"
#include "core/sha256.h"

namespace atlas::decode {

std::vector<GeneratedRow> generate(const Model& model, std::span<const PromptRow> rows,
                                   const GenerateOptions& opts) {
  const ModelConfig& cfg = model.config();
  const int64_t V = cfg.vocab_size;
  if (!model.has_head()) fail("generate: the model was loaded without its final layers (use all layers)");
  if (opts.max_new_tokens <= 0) fail("--max-new-tokens", {}, "must be positive");
  if (opts.batch <= 0) fail("--batch", {}, "must be positive");
  if (opts.decode_ahead < 0 || opts.decode_ahead >= DecodeRun::kMaxPending)
    fail("--decode-ahead", {}, "must lie in [0, " + std::to_string(DecodeRun::kMaxPending - 1) + "], got " +
                                   std::to_string(opts.decode_ahead));
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& row = rows[r];
    if (row.ids.empty()) fail("prompt " + row.id, "ids", "empty prompt");
    for (int32_t id : row.ids)
      if (id < 0 || id >= V)
        fail("prompt " + row.id, "ids", "token id " + std::to_string(id) + " is outside the vocabulary (size " +
                                            std::to_string(V) + ")");
    if (int64_t(row.ids.size()) + opts.max_new_tokens > cfg.max_position_embeddings)
      fail("prompt " + row.id, "ids",
           std::to_string(row.ids.size()) + " prompt tokens + " + std::to_string(opts.max_new_tokens) +
               " new tokens exceed the model's context (max_position_embeddings " +
               std::to_string(cfg.max_position_embeddings) + ")");
    validate(row.sampling);
  }
  StopCriteria criteria{.eos_ids = opts.eos_ids, .max_new_tokens = opts.max_new_tokens,
                        .stop_strings = opts.stop_strings};
  validate(criteria);

  // Sampled rows draw where the logits are when the backend can (the same tokens, bit for bit:
  // decode/sample_core.h), so their [V] logits never travel to the host. An observer of the
  // logits needs them on the host anyway; ATLAS_DEVICE_SAMPLING=0 forces the host path (for
  // checking one against the other).
  // Unset, "1": allowed; "0": off; anything else is an error naming the variable.
  const char* env_dev = std::getenv("ATLAS_DEVICE_SAMPLING");
  const std::string dev_switch = env_dev == nullptr ? "" : env_dev;
  if (!dev_switch.empty() && dev_switch != "0" && dev_switch != "1")
    fail("ATLAS_DEVICE_SAMPLING", {}, "expected 0 or 1, got '" + dev_switch + "'");
  const bool device_sampling = model.supports_device_sampling() && !opts.on_logits && dev_switch != "0";
  if (!opts.row_edits.empty() && opts.row_edits.size() != rows.size())
    fail("generate: row_edits must have one entry per row");
  if (int64_t(rows.size()) > opts.batch)
    for (const Interventions* e : opts.row_edits)
      if (e && e->reads_siblings())
        fail("generate: a row's edits read sibling rows by their batch index; run every row in one batch");
  // Hook edits: per batch, one set of observers (the edits of every row, then each row's own),
  // told each pass's positions and mask and, for a row's own, which row is theirs.
  struct BatchEdit {
    Interventions* edits;
    std::vector<uint8_t> rows;  // [B]; empty = every row
  };
  std::vector<BatchEdit> batch_edits;
  Hooks edit_hooks;
  const auto forward = [&](const ForwardInput& in, Cache& cache) {
    if (batch_edits.empty()) return model.forward(in, cache);
    for (BatchEdit& e : batch_edits) e.edits->begin_pass(in, e.rows);
    ForwardOutput o = model.forward(in, cache, &edit_hooks);
    for (const BatchEdit& e : batch_edits) e.edits->check_fired();
    return o;
  };
  std::vector<GeneratedRow> results(rows.size());
  const auto t_start = std::chrono::steady_clock::now();
  int64_t tokens_done = 0;
  for (size_t start = 0; start < rows.size(); start += size_t(opts.batch)) {
    const size_t nb = std::min(rows.size() - start, size_t(opts.batch));
    const int64_t B = int64_t(nb);
    batch_edits.clear();
    edit_hooks = Hooks();
    if (opts.edits) batch_edits.push_back({opts.edits, {}});
    if (!opts.row_edits.empty())
      for (size_t r = 0; r < nb; ++r)
        if (Interventions* e = opts.row_edits[start + r]) {
          auto same = std::find_if(batch_edits.begin() + (opts.edits ? 1 : 0), batch_edits.end(),
                                   [&](const BatchEdit& b) { return b.edits == e; });
          if (same == batch_edits.end()) same = batch_edits.insert(batch_edits.end(), {e, std::vector<uint8_t>(nb, 0)});
          same->rows[r] = 1;
        }
    for (BatchEdit& e : batch_edits) e.edits->attach(edit_hooks);
    int64_t Tp = 0;
    for (size_t r = 0; r < nb; ++r) Tp = std::max<int64_t>(Tp, int64_t(rows[start + r].ids.size()));

    // Prefill: left-padded prompts.
    std::vector<int32_t> ids, pos, next_pos(nb);
    std::vector<uint8_t> mask;
    for (size_t r = 0; r < nb; ++r) {
      const auto& p = rows[start + r].ids;
      const int64_t npad = Tp - int64_t(p.size());
      for (int64_t t = 0; t < Tp; ++t) {
        const bool real = t >= npad;
        ids.push_back(real ? p[size_t(t - npad)] : opts.pad_id);
        pos.push_back(real ? int32_t(t - npad) : 0);
        mask.push_back(real ? 1 : 0);
      }
      next_pos[r] = int32_t(p.size());
    }
    // Rows that need their logits on the host: sampled rows and, when observed, every row.
    // Greedy rows need only their token (ForwardOutput::greedy, computed where the logits are).
    // With device sampling, no row needs them: `want` stays 0 and `on_device` marks the
    // sampled rows instead.
    std::vector<uint8_t> want(nb, 0), on_device(nb, 0);
    bool any_sampled = false;
    for (size_t r = 0; r < nb; ++r) {
      const bool sampled = rows[start + r].sampling.mode != SamplingMode::Greedy;
      any_sampled = any_sampled || sampled;
      on_device[r] = (sampled && device_sampling) ? 1 : 0;
      want[r] = (opts.on_logits || (sampled && !device_sampling)) ? 1 : 0;
    }
    std::vector<RowSampler> samplers;
    for (size_t r = 0; r < nb; ++r) samplers.emplace_back(rows[start + r].sampling);
    // Per-row device sampling parameters of a coming forward pass: the uniform of each live
    // row's draw `ahead` steps after its next one; empty when nothing samples on the device.
    const auto dev_params_at = [&](const std::vector<uint8_t>& done_rows, uint64_t ahead) {
      std::vector<sample_core::RowParams> params;
      if (!device_sampling || !any_sampled) return params;
      params.resize(nb);  // kGreedy by default
      for (size_t r = 0; r < nb; ++r)
        if (on_device[r] && !done_rows[r]) {
          const SamplingParams& sp = samplers[r].params();
          params[r] = sample_core::make_row_params(sp.temperature, sp.top_p, sp.top_k,
                                                   samplers[r].uniform_at(samplers[r].step() + ahead));
        }
      return params;
    };
    std::vector<sample_core::RowParams> dev_params = dev_params_at(std::vector<uint8_t>(nb, 0), 0);
    auto cache = model.make_cache(B, Tp + opts.max_new_tokens);
    ForwardOutput out = forward({.batch = B, .tokens = Tp, .ids = ids, .positions = pos, .mask = mask,
                                 .logits_last_only = true, .logits_rows = want, .attention = opts.prefill_attention,
                                 .sampling = dev_params},
                                *cache);

    std::vector<StopChecker> stops;
    for (size_t r = 0; r < nb; ++r) {
      const PromptRow& row = rows[start + r];
      stops.emplace_back(criteria);
      GeneratedRow& g = results[start + r];
      g.id = row.id;
      g.prompt_sha256 = ids_sha256(row.ids);
      g.rng_state_sha256 = samplers[r].rng_state_sha256();
    }
    std::vector<uint8_t> done(nb, 0);
    size_t n_done = 0;
    // Where no live row needs its logits on the host (every one greedy or drawn on the device,
    // no on_logits), the decode steps run as a DecodeRun: each step is fed the step before's
    // tokens where they were made, and decode_ahead steps are pushed beyond the one whose tokens
    // are read next, so the device never waits for this loop. A row that stops keeps computing
    // until the batch ends, fed its own tokens; nothing it computes is read (as with the pad id a
    // finished row gets otherwise), and a row's tokens do not depend on its batch. At the batch's
    // end the steps pushed ahead (at most decode_ahead) run unread. (Declared after the cache:
    // destroyed first.)
    std::unique_ptr<DecodeRun> run;
    int64_t pushed_through = 0;  // the last decode step pushed to the run
    for (int64_t step = 0; n_done < nb; ++step) {
      std::vector<int32_t> chained;  // this step's tokens, from the run
      if (run) chained = run->pop();
      std::vector<int32_t> step_ids(nb, opts.pad_id), step_pos(nb, 0);
      std::vector<uint8_t> step_mask(nb, 1);
      // Sampled rows draw in parallel (each RowSampler is a pure function of its own row, so
      // the threads change nothing); an observer of the logits keeps the loop sequential.
      std::vector<int32_t> drawn(nb, 0);
      if (!opts.on_logits && chained.empty()) {
        std::vector<std::exception_ptr> errors(nb);
#pragma omp parallel for schedule(dynamic)
        for (int64_t r = 0; r < int64_t(nb); ++r) {
          if (done[size_t(r)] || !want[size_t(r)]) continue;
          try {
            drawn[size_t(r)] = int32_t(samplers[size_t(r)].next(
                std::span<const float>(out.logits.data() + size_t(r) * size_t(V), size_t(V))));
          } catch (...) {
            errors[size_t(r)] = std::current_exception();
          }
        }
        for (const auto& e : errors)
          if (e) std::rethrow_exception(e);
      }
      for (size_t r = 0; r < nb; ++r) {
        if (done[r]) continue;
        GeneratedRow& g = results[start + r];
        int32_t tok = 0;
        if (!chained.empty()) {
          tok = chained[r];  // (a run exists only where no live row wants its logits)
          if (on_device[r]) samplers[r].advance();
        } else if (want[r] && opts.on_logits) {
          std::span<const float> logits(out.logits.data() + r * size_t(V), size_t(V));
          opts.on_logits(start + r, step, logits);
          tok = int32_t(samplers[r].next(logits));
        } else if (want[r]) {
          tok = drawn[r];
        } else if (on_device[r]) {
          tok = out.greedy.at(r);  // drawn on the device from uniform_at(step())
          samplers[r].advance();
        } else {
          tok = out.greedy.at(r);  // the same argmax contract as RowSampler's greedy mode
        }
        g.ids.push_back(tok);
        ++tokens_done;
        std::string text;
        if (!opts.stop_strings.empty() && opts.detokenize) text = opts.detokenize(g.ids);
        const StopReason why = stops[r].update(tok, text);
        if (why != StopReason::None) {
          g.stop = why;
          g.n_new = int64_t(g.ids.size());
          if (opts.detokenize) g.text = opts.detokenize(g.ids);
          done[r] = 1;
          ++n_done;
          if (opts.on_row) opts.on_row(start + r, g);
          continue;
        }
        step_ids[r] = tok;
        step_pos[r] = next_pos[r]++;
      }
      for (size_t r = 0; r < nb; ++r)
        if (done[r]) want[r] = 0;  // a finished row's logits are never read
      if (opts.progress) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        // ETA at most: every live row to max_new_tokens, every later row too (EOS ends rows sooner).
        const double rate = s > 0 ? double(tokens_done) / s : 0.0;
        const double left = double(nb - n_done) * double(opts.max_new_tokens - step - 1) +
                            double(rows.size() - start - nb) * double(opts.max_new_tokens);
        std::fprintf(stderr, "\rgenerate: rows %zu-%zu of %zu, step %lld, %.1f tok/s, ETA <= %s   ", start + 1,
                     start + nb, rows.size(), (long long)step + 1, rate, rate > 0 ? format_hms(left / rate).c_str() : "?");
      }
      if (n_done == nb) break;
      bool host_logits = opts.on_logits != nullptr;
      for (size_t r = 0; r < nb; ++r) host_logits = host_logits || (!done[r] && want[r]);
      if (!run && !host_logits && opts.decode_ahead > 0 && batch_edits.empty()) {
        run = model.start_decode(*cache, step_ids, opts.decode_attention);
        pushed_through = step;
      }
      if (run) {
        // Steps step + 1 .. step + 1 + decode_ahead, as far as any row may need them (all live
        // rows have step + 1 tokens). Step q's positions continue from step_pos (step + 1's);
        // its draws are the uniforms after the ones consumed so far.
        const int64_t last = std::min(step + 1 + opts.decode_ahead, opts.max_new_tokens - 1);
        for (int64_t q = pushed_through + 1; q <= last; ++q) {
          const int32_t d = int32_t(q - (step + 1));
          std::vector<int32_t> q_pos(nb, 0);  // finished rows: position 0, greedy (as the pad id's steps)
          for (size_t r = 0; r < nb; ++r)
            if (!done[r]) q_pos[r] = step_pos[r] + d;
          run->push(q_pos, dev_params_at(done, uint64_t(d)));
          pushed_through = q;
        }
        continue;
      }
      dev_params = dev_params_at(done, 0);
      out = forward({.batch = B, .tokens = 1, .ids = step_ids, .positions = step_pos, .mask = step_mask,
                     .logits_last_only = true, .logits_rows = want, .attention = opts.decode_attention,
                     .sampling = dev_params},
                    *cache);
    }
  }
  if (opts.progress) std::fprintf(stderr, "\n");
  return results;
}

}  // namespace atlas::decode
