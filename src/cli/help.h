// The option summary `mpnfs --help` prints: one line per option, grouped as
// in mpnfs(8), which stays the reference. options_test checks that every
// option of the man page's OPTIONS section is listed here and that each
// listed example is accepted by the parser.
#pragma once

#include <string>
#include <vector>

namespace mpnfs::cli {

struct OptionHelp {
  const char* section;  // the man page subsection it belongs to
  const char* syntax;   // as typed after -o, e.g. "timeo=DECISECONDS"
  const char* example;  // a complete -o argument using it that the parser accepts
  const char* text;     // one line
};

const std::vector<OptionHelp>& OptionHelpTable();

// Usage, flags and the option table, for --help.
std::string HelpText();

}  // namespace mpnfs::cli
