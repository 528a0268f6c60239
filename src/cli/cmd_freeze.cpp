// atlas freeze PROTOCOL.toml --out MANIFEST.json [--model DIR] [--data DIR] [--per-domain N]
// [--reference-selection MANIFEST.json]:
// resolves every cell of a probe protocol to token ids with its verified contract, before any
// model output exists (tokenizer only; no weights are read).
#include <cstdio>
#include <filesystem>
#include <optional>

#include "cli/command.h"
#include "core/file.h"
#include "probe/freeze.h"

namespace atlas::cli {
namespace {

struct FreezeArgs {
  std::string protocol, out, model, data, reference;
  std::optional<int64_t> per_domain;  // 0 is an error (freeze says so), not "not given"
};

Registrar reg{{
    .name = "freeze",
    .help = "Freeze a probe protocol into a manifest of cells (token ids, edits, verified contracts)",
    .setup =
        [](CLI::App& app) {
          static FreezeArgs a;
          app.add_option("PROTOCOL", a.protocol, "Protocol file (TOML, see docs/probe.md)")->required();
          app.add_option("--out", a.out, "Manifest to write (JSON)")->required();
          app.add_option("--model", a.model, "Model directory (overrides the protocol's; only its tokenizer is read)");
          app.add_option("--data", a.data, "Corpus root (overrides the protocol's [data] root)");
          app.add_option("--per-domain", a.per_domain, "Sources per domain (overrides the protocol's; for small runs)");
          app.add_option("--reference-selection", a.reference,
                         "Take the sources (ids, ranks, order) of this frozen manifest, texts re-hashed (overrides "
                         "[selection] reference)");
          app.callback([] {
            probe::FreezeOptions o{.protocol = a.protocol, .model_dir = a.model, .data_root = a.data, .per_domain = {}};
            o.per_domain = a.per_domain;
            o.selection_reference = a.reference;
            o.manifest_dir = std::filesystem::path(a.out).parent_path().string();
            ojson m = probe::freeze(o);
            write_file_atomic(a.out, m.dump(1) + "\n");
            const auto& c = m["contracts"];
            std::printf("froze %s: %lld cells (%lld sources x %lld conditions%s), %zu batches, contracts verified\n",
                        m["protocol"]["name"].get<std::string>().c_str(), (long long)c["cells"].get<int64_t>(),
                        (long long)c["sources"].get<int64_t>(), (long long)c["conditions"].get<int64_t>(),
                        m["protocol"]["execution"].contains("seeds") && !m["protocol"]["execution"]["seeds"].empty()
                            ? " x seeds" : "",
                        m["batches"].size());
            std::printf("manifest %s  sha256 %s\n", a.out.c_str(), m["manifest_sha256"].get<std::string>().c_str());
          });
        },
}};

}  // namespace
}  // namespace atlas::cli
