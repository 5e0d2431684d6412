// WaitAllUp: for engine tests, waits (up to 5 s) until every connection of
// an engine reports "up"; a test failure if they do not.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "engine/engine.h"

namespace mpnfs::testing {

inline void WaitAllUp(engine::Engine& e) {
  for (int i = 0; i < 500; ++i) {
    auto st = e.Stats();
    if (std::all_of(st.begin(), st.end(), [](auto& s) { return s.state == "up"; })) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "connections did not come up";
}

}  // namespace mpnfs::testing
