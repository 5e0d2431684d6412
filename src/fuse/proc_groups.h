// The supplementary groups of the process behind a FUSE request, from
// /proc/PID/task/PID/status (what libfuse's fuse_req_getgroups reads).
//
// Not libfuse's function: in 3.14 it runs strstr over a buffer it never
// NUL-terminates, reading past what read() returned into uninitialised heap
// and, where the allocation ends at a page boundary, crashing the daemon
// (seen under ThreadSanitizer in test_writeback's truncate race).
//
// Thread safety: plain functions. ReadGroups() does blocking file I/O: call
// it from FUSE worker threads, never from an engine loop.
#pragma once

#include <sys/types.h>

#include <string_view>
#include <vector>

namespace mpnfs::fuse {

// The numbers on the "Groups:" line of a status file's text, which need not
// end in a NUL; empty if there is no such line.
std::vector<gid_t> ParseStatusGroups(std::string_view status);

// The groups of process `pid`; false if its status cannot be read (it has
// exited, or /proc is not mounted).
bool ReadGroups(pid_t pid, std::vector<gid_t>* groups);

}  // namespace mpnfs::fuse
