#include "so/io/direct_io_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "so/core/error.h"

namespace so {

namespace {

uint64_t align_down(uint64_t x) { return x & ~uint64_t{DirectIoFile::kBlock - 1}; }
uint64_t align_up(uint64_t x) { return align_down(x + DirectIoFile::kBlock - 1); }

// The whole transfer, EINTR retried: bytes moved (fewer only at the end of a file being read),
// or -errno.
template <class Op>
long transfer_all(Op op, char* p, size_t bytes, uint64_t offset) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = op(p + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<long>(done);
}

long pwrite_all(int fd, const char* p, size_t bytes, uint64_t offset) {
  return transfer_all([fd](char* q, size_t n, off_t at) { return ::pwrite(fd, q, n, at); }, const_cast<char*>(p), bytes,
                      offset);
}
long pread_all(int fd, char* p, size_t bytes, uint64_t offset) {
  return transfer_all([fd](char* q, size_t n, off_t at) { return ::pread(fd, q, n, at); }, p, bytes, offset);
}

void check_write(long r, size_t bytes, uint64_t offset, const std::string& what, const std::string& path) {
  SO_CHECK(r == static_cast<long>(bytes), what, ": writing '", path, "' failed at byte ", offset, ": ",
           r < 0 ? std::strerror(static_cast<int>(-r)) : "no progress");
}
void check_read(long r, size_t bytes, uint64_t offset, const std::string& what, const std::string& path) {
  SO_CHECK(r == static_cast<long>(bytes), what, ": reading '", path, "' failed at byte ", offset, ": ",
           r < 0 ? std::strerror(static_cast<int>(-r)) : "the file ends there (truncated)");
}

}  // namespace

DirectIoFile::DirectIoFile(const std::string& path, Mode mode, bool allow_direct) : path_(path), mode_(mode) {
  const int flags = (mode == Mode::Write ? O_WRONLY : O_RDONLY) | O_CLOEXEC;
  fd_ = ::open(path.c_str(), flags);
  SO_CHECK(fd_ >= 0, "cannot open '", path, "' for ", mode == Mode::Write ? "writing" : "reading", ": ",
           std::strerror(errno));
  struct stat st {};
  SO_CHECK(::fstat(fd_, &st) == 0, "cannot stat '", path, "': ", std::strerror(errno));
  size_ = static_cast<uint64_t>(st.st_size);
  if (!allow_direct) return;
  direct_fd_ = ::open(path.c_str(), flags | O_DIRECT);  // EINVAL where the file system has no O_DIRECT
  if (direct_fd_ < 0) return;
  requests_.resize(kBuffers);
  for (Request& r : requests_) {
    void* p = nullptr;
    SO_CHECK(::posix_memalign(&p, kBlock, kPieceBytes) == 0, "cannot allocate I/O buffers for '", path, "'");
    r.buf = {static_cast<char*>(p), std::free};
  }
  io_ = std::thread([this] { run(); });
}

DirectIoFile::~DirectIoFile() {
  if (io_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    io_.join();  // the queue is emptied first
  }
  try {
    write_pending("closing");
  } catch (const std::exception&) {  // unseen, as the header says: sync() is where failures are reported
  }
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ >= 0) ::close(fd_);
}

// A request the file system refuses direct (EINVAL: its blocks are larger than 4 KiB) goes the
// buffered way instead: the same bytes, only slower.
void DirectIoFile::transfer(Request& r) {
  char* p = r.buf.get();
  long n = writing() ? pwrite_all(direct_fd_, p, r.bytes, r.at) : pread_all(direct_fd_, p, r.bytes, r.at);
  if (n == -EINVAL) n = writing() ? pwrite_all(fd_, p, r.bytes, r.at) : pread_all(fd_, p, r.bytes, r.at);
  r.error = n < 0 ? -n : (writing() && n != static_cast<long>(r.bytes) ? EIO : 0);
  r.got = n < 0 ? 0 : static_cast<size_t>(n);
}

void DirectIoFile::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and nothing left to do
    Request& r = *queue_.front();
    lock.unlock();
    transfer(r);
    lock.lock();
    queue_.pop_front();
    if (writing() && r.error != 0 && write_error_.empty())
      write_error_ =
          str_cat("writing '", path_, "' failed at byte ", r.at, ": ", std::strerror(static_cast<int>(r.error)));
    r.busy = false;
    cv_.notify_all();
  }
}

void DirectIoFile::submit(Request& r, size_t bytes, uint64_t at) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    r.bytes = bytes, r.at = at, r.busy = true, r.error = 0, r.got = 0;
    queue_.push_back(&r);
  }
  cv_.notify_all();
}

void DirectIoFile::wait(Request& r) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !r.busy; });
}

void DirectIoFile::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty(); });
}

DirectIoFile::Request& DirectIoFile::free_write_buffer(const std::string& what) {
  Request& r = requests_[static_cast<size_t>(next_)];
  next_ = (next_ + 1) % kBuffers;
  wait(r);
  std::lock_guard<std::mutex> lock(mu_);
  if (!write_error_.empty()) {
    std::string e;
    std::swap(e, write_error_);
    throw Error(str_cat(what, ": ", e));
  }
  return r;
}

void DirectIoFile::write_at(const void* data, size_t bytes, uint64_t offset, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  write_from(
      bytes, offset, [p](char* dst, size_t from, size_t n) { std::memcpy(dst, p + from, n); }, what);
}

void DirectIoFile::write_from(size_t bytes, uint64_t offset, const Fill& fill, const std::string& what) {
  const uint64_t end = offset + bytes;
  // Bytes [a, b) of the file through the page cache: at once when nothing goes direct, else kept
  // for sync() (they are under two blocks).
  const auto buffered = [&](uint64_t a, uint64_t b) {
    if (a >= b) return;
    if (direct()) {
      pending_.push_back({a, std::vector<char>(static_cast<size_t>(b - a))});
      fill(pending_.back().bytes.data(), static_cast<size_t>(a - offset), static_cast<size_t>(b - a));
      return;
    }
    bounce_.resize(std::max(bounce_.size(), static_cast<size_t>(std::min<uint64_t>(kPieceBytes, b - a))));
    for (uint64_t at = a; at < b;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kPieceBytes, b - at));
      fill(bounce_.data(), static_cast<size_t>(at - offset), n);
      check_write(pwrite_all(fd_, bounce_.data(), n, at), n, at, what, path_);
      at += n;
    }
  };
  const uint64_t mid_begin = align_up(offset), mid_end = align_down(end);
  if (!direct() || mid_begin >= mid_end) {
    buffered(offset, end);
    return;
  }
  // The partial first and last blocks kept, the whole ones queued.
  buffered(offset, mid_begin);
  for (uint64_t at = mid_begin; at < mid_end;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kPieceBytes, mid_end - at));
    Request& r = free_write_buffer(what);
    fill(r.buf.get(), static_cast<size_t>(at - offset), n);
    submit(r, n, at);
    at += n;
  }
  buffered(mid_end, end);
}

// The kept partial blocks, in file order, those that touch written together.
void DirectIoFile::write_pending(const std::string& what) {
  std::vector<Pending> pending;
  std::swap(pending, pending_);
  std::stable_sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) { return a.at < b.at; });
  for (size_t i = 0; i < pending.size();) {
    bounce_.clear();
    const uint64_t at = pending[i].at;
    for (; i < pending.size() && pending[i].at == at + bounce_.size(); ++i)
      bounce_.insert(bounce_.end(), pending[i].bytes.begin(), pending[i].bytes.end());
    check_write(pwrite_all(fd_, bounce_.data(), bounce_.size(), at), bounce_.size(), at, what, path_);
  }
}

void DirectIoFile::reset_plan() {
  for (Request& r : requests_) {  // no buffer holds an extent of the old plan
    wait(r);
    r.extent = kNoExtent;
  }
  plan_.clear();
  cursor_ = 0;
}

void DirectIoFile::will_read(const std::vector<Range>& ranges) {
  if (!direct()) return;
  reset_plan();
  // Block-aligned spans, merged where the next starts within the last (ranges sharing a block),
  // then cut into extents. Small reads go through the page cache: not planned.
  std::vector<Extent> spans;
  const uint64_t file_end = align_up(size_);
  for (const Range& r : ranges) {
    if (r.bytes < kSmallRead) continue;
    const uint64_t a = align_down(r.offset), b = std::min(align_up(r.offset + r.bytes), file_end);
    if (a >= b) continue;
    if (!spans.empty() && a >= spans.back().at && a <= spans.back().at + spans.back().bytes)
      spans.back().bytes = static_cast<size_t>(std::max(b, spans.back().at + spans.back().bytes) - spans.back().at);
    else
      spans.push_back({a, static_cast<size_t>(b - a)});
  }
  for (const Extent& sp : spans) plan_extents(sp.at, sp.at + sp.bytes);
}

void DirectIoFile::plan_extents(uint64_t begin, uint64_t end) {
  for (uint64_t at = begin; at < end; at += kPieceBytes)
    plan_.push_back({at, static_cast<size_t>(std::min<uint64_t>(kPieceBytes, end - at))});
}

size_t DirectIoFile::extent_of(uint64_t at) {
  for (size_t k = cursor_; k < plan_.size(); ++k)
    if (plan_[k].at <= at && at < plan_[k].at + plan_[k].bytes) return cursor_ = k;
  reset_plan();  // off the plan: on through the file from here
  plan_extents(align_down(at), align_up(size_));
  return cursor_;
}

DirectIoFile::Request& DirectIoFile::fetch(size_t k) {
  for (Request& r : requests_)
    if (r.extent == k) return r;
  for (Request& r : requests_)
    if (r.extent == kNoExtent || r.extent < cursor_ || r.extent >= cursor_ + kBuffers) {
      wait(r);
      r.extent = k;
      direct_bytes_read_ += plan_[k].bytes;
      submit(r, plan_[k].bytes, plan_[k].at);
      return r;
    }
  SO_CHECK(false, "DirectIoFile: no buffer free for extent ", k, " of '", path_, "'");
  return requests_.front();
}

void DirectIoFile::read_at(void* out, size_t bytes, uint64_t offset, const std::string& what) {
  char* const dst = static_cast<char*>(out);
  read_to(
      bytes, offset, [dst](const char* src, size_t from, size_t n) { std::memcpy(dst + from, src, n); }, what);
}

void DirectIoFile::read_to(size_t bytes, uint64_t offset, const Sink& sink, const std::string& what) {
  const uint64_t end = offset + bytes;
  uint64_t at = offset;  // everything before went to the sink
  // Small reads (checksum tables, norm weights) go through the page cache: a piece read around it
  // would move 4 MiB for a few bytes, and evict the pieces read ahead.
  const bool small = bytes < kSmallRead;
  while (direct() && !small && at < end && at < size_) {
    const size_t k = extent_of(at);
    Request& r = fetch(k);
    for (size_t q = k + 1; q < k + kBuffers && q < plan_.size(); ++q) fetch(q);  // read ahead
    wait(r);
    if (r.error != 0) {
      const long e = r.error;
      r.extent = kNoExtent;  // a later call tries again
      SO_CHECK(false, what, ": reading '", path_, "' failed at byte ", r.at, ": ", std::strerror(static_cast<int>(e)));
    }
    const uint64_t valid_end = std::min<uint64_t>(r.at + r.got, end);
    if (valid_end <= at) break;  // the file is shorter than when opened: the read below says so
    sink(r.buf.get() + (at - r.at), static_cast<size_t>(at - offset), static_cast<size_t>(valid_end - at));
    at = valid_end;
  }
  while (at < end) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kPieceBytes, end - at));
    bounce_.resize(std::max(bounce_.size(), n));
    check_read(pread_all(fd_, bounce_.data(), n, at), n, at, what, path_);
    sink(bounce_.data(), static_cast<size_t>(at - offset), n);
    at += n;
  }
}

void DirectIoFile::sync(const std::string& what) {
  if (direct()) {
    drain();
    std::lock_guard<std::mutex> lock(mu_);
    if (!write_error_.empty()) {
      std::string e;
      std::swap(e, write_error_);
      throw Error(str_cat(what, ": ", e));
    }
  }
  write_pending(what);
  SO_CHECK(::fdatasync(fd_) == 0, what, ": fdatasync of '", path_, "' failed: ", std::strerror(errno));
}

}  // namespace so
