// AlignedBuf: a heap buffer aligned to the 4 KiB page, for O_DIRECT reads
// and writes of the cache's data file. Contents are not initialised.
//
// Thread safety: none (a value).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace mpnfs::cache {

class AlignedBuf {
 public:
  static constexpr size_t kAlign = 4096;
  AlignedBuf() = default;
  explicit AlignedBuf(size_t n) { resize(n); }

  // Keeps nothing of the old contents when it has to grow.
  void resize(size_t n) {
    if (n > cap_) {
      const size_t cap = (n + kAlign - 1) / kAlign * kAlign;
      void* p = std::aligned_alloc(kAlign, cap);
      if (p == nullptr) throw std::bad_alloc();
      p_.reset(static_cast<char*>(p));
      cap_ = cap;
    }
    size_ = n;
  }
  char* data() { return p_.get(); }
  const char* data() const { return p_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> p_;
  size_t size_ = 0, cap_ = 0;
};

}  // namespace mpnfs::cache
