// Progress lines on stderr (long commands: probe runs, generation): shared formatting.
#pragma once

#include <cstdio>
#include <string>

namespace atlas {

// Seconds as H:MM:SS (rounded to the second; negative reads as 0), for ETAs.
inline std::string format_hms(double seconds) {
  const long v = seconds > 0 ? long(seconds + 0.5) : 0;
  char b[32];
  std::snprintf(b, sizeof b, "%ld:%02ld:%02ld", v / 3600, (v / 60) % 60, v % 60);
  return b;
}

}  // namespace atlas
