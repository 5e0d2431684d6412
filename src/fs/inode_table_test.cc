#include "fs/inode_table.h"

#include <gtest/gtest.h>

#include <thread>

namespace mpnfs::fs {
namespace {

TEST(InodeTableTest, RootIsPinned) {
  InodeTable t("root");
  ASSERT_NE(t.Get(InodeTable::kRootIno), nullptr);
  t.Forget(InodeTable::kRootIno, 100);
  EXPECT_NE(t.Get(InodeTable::kRootIno), nullptr);
}

TEST(InodeTableTest, SameHandleSameInodeAndCountsLookups) {
  InodeTable t("root");
  auto a = t.Intern("fh-a");
  auto b = t.Intern("fh-a");
  EXPECT_EQ(a->ino(), b->ino());
  EXPECT_EQ(t.LookupCount(a->ino()), 2u);
  auto c = t.Intern("fh-c");
  EXPECT_NE(c->ino(), a->ino());
}

TEST(InodeTableTest, ForgetRemovesAtZeroAndNumbersAreNotReused) {
  InodeTable t("root");
  auto a = t.Intern("fh-a");
  const uint64_t ino = a->ino();
  t.Intern("fh-a");
  t.Forget(ino, 1);
  EXPECT_NE(t.Get(ino), nullptr);
  t.Forget(ino, 1);
  EXPECT_EQ(t.Get(ino), nullptr);
  a.reset();  // nothing uses it any more
  EXPECT_EQ(t.Find("fh-a"), nullptr);
  auto again = t.Intern("fh-a");
  EXPECT_NE(again->ino(), ino);  // a late request for `ino` gets ESTALE, not this file
}

TEST(InodeTableTest, AForgottenInodeStillInUseComesBackAsItWas) {
  InodeTable t("root");
  auto a = t.Intern("fh-a");  // (held, as a write on its way holds it)
  const uint64_t ino = a->ino();
  EXPECT_EQ(t.Forget(ino, 1), a);
  EXPECT_EQ(t.Get(ino), nullptr);
  EXPECT_EQ(t.Find("fh-a"), a);
  EXPECT_FALSE(t.Known("fh-a"));
  auto again = t.Intern("fh-a");
  EXPECT_EQ(again, a);
  EXPECT_EQ(t.Get(ino), a);
  EXPECT_EQ(t.LookupCount(ino), 1u);
  EXPECT_TRUE(t.Known("fh-a"));
  // Many forgotten and released: swept, and none comes back.
  for (int i = 0; i < 1000; ++i) {
    auto n = t.Intern("fh-" + std::to_string(i));
    t.Forget(n->ino(), 1);
  }
  EXPECT_EQ(t.Find("fh-7"), nullptr);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_LE(t.ForgottenEntries(), 128u) << "released entries are not swept";
}

TEST(InodeTableTest, ConcurrentInternAndForgetKeepCountsExact) {
  InodeTable t("root");
  auto first = t.Intern("shared");  // keep one reference so the inode stays
  const uint64_t ino = first->ino();
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 10000; ++k) {
        auto n = t.Intern("shared");
        t.Forget(n->ino(), 1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(t.LookupCount(ino), 1u);
  EXPECT_EQ(t.size(), 2u);
}

}  // namespace
}  // namespace mpnfs::fs
