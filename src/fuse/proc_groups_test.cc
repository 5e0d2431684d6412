#include "fuse/proc_groups.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace mpnfs::fuse {
namespace {

TEST(ProcGroups, TheGroupsLineIsParsed) {
  EXPECT_EQ(ParseStatusGroups("Name:\tx\nUid:\t0\nGroups:\t4 24 27 1000 \nNSpid:\t1\n"),
            (std::vector<gid_t>{4, 24, 27, 1000}));
  EXPECT_TRUE(ParseStatusGroups("Name:\tx\nGroups:\t\nNSpid:\t1\n").empty());
  EXPECT_TRUE(ParseStatusGroups("Name:\tx\n").empty());
}

// libfuse 3.14 searched past the bytes read. Here only the view counts: a
// "Groups:" line beyond its end (in the same buffer) is not seen, and the
// last number is not extended by bytes beyond it.
TEST(ProcGroups, NothingBeyondTheTextReadIsLookedAt) {
  const std::string buffer = "Name:\tx\nUid:\t0\n" "\nGroups:\t999\n";
  EXPECT_TRUE(ParseStatusGroups(std::string_view(buffer).substr(0, 15)).empty());
  const std::string cut = "Name:\tx\nGroups:\t12345";
  EXPECT_EQ(ParseStatusGroups(std::string_view(cut).substr(0, cut.size() - 2)),
            (std::vector<gid_t>{123}));
}

TEST(ProcGroups, ThisProcessesGroupsAreTheKernels) {
  std::vector<gid_t> got;
  ASSERT_TRUE(ReadGroups(getpid(), &got));
  std::vector<gid_t> want(static_cast<size_t>(getgroups(0, nullptr)));
  ASSERT_EQ(getgroups(static_cast<int>(want.size()), want.data()), static_cast<int>(want.size()));
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
  EXPECT_FALSE(ReadGroups(-5, &got));
}

}  // namespace
}  // namespace mpnfs::fuse
