// mpnfstab: the configuration file of mpnfs, in the spirit of Oracle's
// oranfstab. It names servers, the network paths that reach each, the
// exports mounted from it and per-server mount options:
//
//   server: filer1                 # starts a block; the name used in SERVER:/EXPORT
//   path: 10.0.1.2                 # one line per path (server address)
//   path: 10.0.2.2
//   export: /vol/data  mount: /mnt/data
//   options: conns_per_path=2,timeo=100
//
// Which file: `-o tab=FILE`, else $MPNFS_TAB, else /etc/mpnfstab; every one
// of these that is named (or, for /etc/mpnfstab, exists) is read, and the
// first with a block matching the mount wins. A block matches when one of
// its `export:`/`mount:` pairs names the mountpoint, or names the export and
// the block's server is SERVER. A match supplies the paths (unless path= is
// given) and options that the command line can override. A malformed line
// is an error naming file:line, and the mount does not start.
//
// Thread safety: pure functions.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cli/options.h"
#include "mpnfs/result.h"

namespace mpnfs::cli {

struct TabEntry {
  struct ExportMount {
    std::string export_path;
    std::string mount;
  };
  std::string server;
  std::vector<std::string> paths;
  std::vector<std::string> locals;  // `local:` of each path, in path order ("" if none)
  std::vector<ExportMount> exports;
  std::string options;
  std::string where;  // file:line of the `server:` line
};

Result<std::vector<TabEntry>> ParseTab(const std::string& text, const std::string& filename);

// The first entry that matches (see above), or nullptr.
const TabEntry* FindTabEntry(const std::vector<TabEntry>& entries, const std::string& server,
                             const std::string& export_path, const std::string& mountpoint);

// Reads a file: nullopt when it does not exist; an Error when it exists but
// cannot be read.
using FileReader = std::function<Result<std::optional<std::string>>(const std::string& path)>;

// ParseMountArgs() plus the mpnfstab lookup. `env_tab` is $MPNFS_TAB (or
// empty). `etc_tab` is normally /etc/mpnfstab.
Result<MountOptions> LoadMountOptions(const std::vector<std::string>& args,
                                      const std::string& env_tab, const std::string& etc_tab,
                                      const FileReader& read);

// The FileReader for the real filesystem.
Result<std::optional<std::string>> ReadFileIfExists(const std::string& path);

}  // namespace mpnfs::cli
