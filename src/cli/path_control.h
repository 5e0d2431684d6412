// The `path ...` commands of the control socket (mpnfsctl path, mpnfs(8)
// ONLINE PATH MAINTENANCE): list, disable, enable, add and remove the paths
// of a live mount, and set a path's weight. The engine does the work (engine.h says what a disable
// or a remove guarantees); this layer parses the command line, resolves an
// added path's address and local binding, and words the answer.
//
// Thread safety: as Engine's path operations (any thread); called from the
// control socket's thread. Resolving a name may block: never call this on
// an engine loop thread.
#pragma once

#include <string>

#include "engine/engine.h"

namespace mpnfs::cli {

// `cmd` starts with "path". "path list" is for any user; the others need
// `privileged`. Returns the answer; one starting with "error:" is a refusal.
std::string PathCommand(const std::string& cmd, bool privileged, engine::Engine& eng);

// The table `path list` prints.
std::string PathTable(const std::vector<engine::PathInfo>& paths);

}  // namespace mpnfs::cli
