// atlas manifest MODEL_DIR --out FILE: pin every file of a model directory by SHA-256
// ({"files": {"relative/path": "<sha256>"}}, sorted), for `inspect --manifest` / loaders.
#include <cstdio>

#include "cli/command.h"
#include "core/file.h"
#include "core/json.h"
#include "io/checkpoint.h"

namespace {
atlas::cli::Registrar reg{{
    .name = "manifest",
    .help = "Write a SHA-256 manifest of every file in a model directory",
    .setup =
        [](CLI::App& app) {
          static std::string dir, out;
          app.add_option("MODEL_DIR", dir, "Model directory")->required();
          app.add_option("--out", out, "Manifest file to write (JSON)")->required();
          app.callback([] {
            auto files = atlas::hash_directory(dir, out);
            // A manifest that pins nothing verifies any directory: refuse it.
            if (files.empty()) atlas::fail(dir, {}, "no files to pin (hidden and .tmp- files are left out)");
            atlas::json j{{"files", atlas::json::object()}};
            for (const auto& [rel, sha] : files) j["files"][rel] = sha;
            atlas::write_file_atomic(out, j.dump(2) + "\n");
            std::printf("wrote %s: %zu files\n", out.c_str(), files.size());
          });
        },
}};
}  // namespace
