// Wait: runs an asynchronous NFS call and blocks until its callback.
// For start-up and other threads that may block; never call it from an
// engine loop thread (the callback would have nobody to run it).
#pragma once

#include <functional>
#include <future>
#include <memory>

#include "mpnfs/result.h"
#include "nfs/nfs3.h"

namespace mpnfs::nfs {

template <class T>
Result<T> Wait(const std::function<void(Cb<T>)>& start) {
  auto p = std::make_shared<std::promise<Result<T>>>();
  auto f = p->get_future();
  start([p](Result<T> r) { p->set_value(std::move(r)); });
  return f.get();
}

}  // namespace mpnfs::nfs
