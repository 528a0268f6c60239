// Difference-of-means directions from probe runs' hidden vectors (record_hidden_vectors): the
// mean of one condition's target rows at one stage minus the mean of another's. The vector is
// written under the stage's hook name, so `--intervene 'HOOK=add:FILE*F'` adds it back (a
// steering vector; docs/stats.md "Directions").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stats/analysis.h"

namespace atlas::stats {

struct DirectionOptions {
  std::string stage;      // a run stage (embed, layer.NN, final_norm) or its hook (blocks.N.hook_resid_post, ...)
  std::string condition;  // mean of its cells' target rows ...
  std::string reference;  // ... minus this condition's
  bool normalize = false; // scale to unit L2 norm
};

struct Direction {
  std::string stage, hook;  // the run's stage name and the hook it is the value of
  std::vector<float> v;     // [H]
  int64_t cells_condition = 0, rows_condition = 0, cells_reference = 0, rows_reference = 0;
  double norm = 0;          // L2 norm of the difference (before normalize)
};

// Sums in double in cell order, then rows in order (the same inputs give the same bits).
// Errors name the flag: unknown stage or condition, no hidden vectors, no rows.
Direction mean_difference(const AnalysisInput& in, const DirectionOptions& o);

}  // namespace atlas::stats
