// When a connection with work outstanding is next looked at for silence
// (Connection::CheckSilence). The rule: a connection silent for half
// path_timeout is probed (a NULL call) and made suspect; one silent for
// path_timeout while another path is heard is declared dead. Each check
// schedules the next for the moment the silence would reach the next of
// those two marks if nothing is heard meanwhile, so a dead path is declared
// dead at path_timeout, not up to a check interval later. Past both marks
// (nothing heard from any path yet, the others are being probed), the
// check repeats every quarter of path_timeout. (Connection::CheckSilence
// also gives a probe sent late a quarter of path_timeout before it judges.)
//
// Pure; thread-agnostic.
#pragma once

#include <chrono>

namespace mpnfs::engine {

inline std::chrono::steady_clock::duration UntilSilenceCheck(std::chrono::steady_clock::duration silent,
                                                             std::chrono::steady_clock::duration path_timeout) {
  if (silent < path_timeout / 2) return path_timeout / 2 - silent;
  if (silent < path_timeout) return path_timeout - silent;
  return path_timeout / 4;
}

}  // namespace mpnfs::engine
