#pragma once
// A file read and written at explicit offsets, with the whole 4 KiB blocks of each transfer going
// around the page cache (O_DIRECT) and only the partial blocks at a transfer's ends through it.
// Why: a checkpoint is written once and read once, so caching it only costs — the kernel must
// find a page for every 4 KiB first, which on virtual machines whose free memory goes back to the
// host is slower than the disk (docs/perf.md, "Checkpoints"), and a 100 GB save evicts the
// training job's own pages. The partial blocks stay buffered because O_DIRECT moves whole blocks
// and a neighbouring rank may own the rest of one. Where the file system refuses O_DIRECT
// (tmpfs, some network file systems), every transfer is buffered.
//
// The direct transfers run on an I/O thread through kBuffers aligned buffers, so the caller's
// work (copying into a buffer, checksums, the next bucket) overlaps the device's: write_at
// returns once its bytes are copied, and a write's failure is reported by a later write_at or by
// sync(). While writing directly, the partial blocks are kept and written by sync(), after the
// direct writes: a buffered write takes the inode lock that a direct write in flight holds (ext4,
// into blocks not yet allocated), so writing them in between stalled the caller for a whole 4 MiB
// transfer each time (docs/perf.md). Each byte must therefore be written once (a checkpoint's
// writers own disjoint bytes): a kept block would land over a later write of the same bytes.
// Reads go by extents of at most 4 MiB, and the kBuffers - 1 after the one being read are read
// ahead: the extents of the ranges will_read named, in that
// order, or else the file's next ones — so a rank reading its own slices of each tensor reads no
// other rank's bytes, and reading a file front to back in small calls keeps the device busy while
// the caller checks and copies. One caller at a time.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace so {

class DirectIoFile {
 public:
  enum class Mode { Read, Write };                 // Write opens an existing file (no create, no truncate)
  static constexpr size_t kBlock = 4096;           // the alignment O_DIRECT needs on Linux
  static constexpr size_t kPieceBytes = 4u << 20;  // one request: the best rate measured here
  static constexpr int kBuffers = 4;               // requests in flight
  static constexpr size_t kSmallRead = 64u << 10;  // reads below go through the page cache

  // allow_direct = false: every transfer buffered (tests compare both paths).
  DirectIoFile(const std::string& path, Mode mode, bool allow_direct = true);
  DirectIoFile(const DirectIoFile&) = delete;
  DirectIoFile& operator=(const DirectIoFile&) = delete;
  ~DirectIoFile();  // finishes the writes (their errors are lost: call sync() to see them)

  // Errors name `what`, the path and the offset.
  void write_at(const void* data, size_t bytes, uint64_t offset, const std::string& what);
  // The same, the bytes supplied by fill(dst, from, n): copy the source's bytes [from, from + n)
  // into dst. Calls come in order and cover each byte once, straight into the I/O buffers, so the
  // source may be anywhere (device memory) and a running checksum can follow the copies.
  using Fill = std::function<void(char* dst, size_t from, size_t n)>;
  void write_from(size_t bytes, uint64_t offset, const Fill& fill, const std::string& what);
  void read_at(void* out, size_t bytes, uint64_t offset, const std::string& what);
  // The same, each piece handed to sink(src, from, n) — the file's bytes [offset + from, + n), in
  // order — where it lies in the I/O buffer, so the caller checks and places it with no copy of
  // its own. `src` is valid only during the call.
  using Sink = std::function<void(const char* src, size_t from, size_t n)>;
  void read_to(size_t bytes, uint64_t offset, const Sink& sink, const std::string& what);
  // The reads to come, in their order: read-ahead follows these byte ranges until a read falls
  // outside them, and then goes on through the file from there.
  struct Range {
    uint64_t offset;
    size_t bytes;
  };
  void will_read(const std::vector<Range>& ranges);
  void sync(const std::string& what);  // every write done, then fdatasync: every byte on the disk
  bool direct() const { return direct_fd_ >= 0; }
  uint64_t direct_bytes_read() const { return direct_bytes_read_; }  // asked of the disk, read-ahead included
  const std::string& path() const { return path_; }

 private:
  struct Request {
    std::unique_ptr<char, void (*)(void*)> buf{nullptr, nullptr};
    size_t bytes = 0;
    uint64_t at = 0;
    bool busy = false;          // queued or in transfer
    long error = 0;             // errno of its transfer, 0: every byte moved
    size_t got = 0;             // bytes a read moved
    size_t extent = kNoExtent;  // reads: which of plan_ the buffer holds or will hold
  };
  static constexpr size_t kNoExtent = ~size_t{0};
  struct Extent {  // one direct read: block-aligned, at most kPieceBytes
    uint64_t at;
    size_t bytes;
  };
  struct Pending {  // a write of partial blocks, kept for sync()
    uint64_t at;
    std::vector<char> bytes;
  };
  // The planned extent holding byte `at`, at or after the cursor; a new plan (the file from
  // `at` on) when there is none.
  size_t extent_of(uint64_t at);
  void reset_plan();
  void plan_extents(uint64_t begin, uint64_t end);  // [begin, end) block-aligned, in kPieceBytes extents
  // The buffer of extent k, read (or being read) into; a new read takes a buffer outside the
  // window [cursor_, cursor_ + kBuffers) the caller reads now and next.
  Request& fetch(size_t k);
  void write_pending(const std::string& what);
  void submit(Request& r, size_t bytes, uint64_t at);
  void wait(Request& r);                                // until r is not busy
  void drain();                                         // every request done
  Request& free_write_buffer(const std::string& what);  // reports an earlier write's failure
  void transfer(Request& r);                            // on the I/O thread
  void run();                                           // the I/O thread

  bool writing() const { return mode_ == Mode::Write; }

  std::string path_;
  Mode mode_;
  int fd_ = -1, direct_fd_ = -1;
  uint64_t size_ = 0;  // of the file when opened for reading
  std::vector<Request> requests_;
  std::vector<char> bounce_;  // small reads, and every transfer when nothing goes direct
  std::vector<Pending> pending_;
  std::vector<Extent> plan_;
  size_t cursor_ = 0;  // the extent of plan_ read now
  uint64_t direct_bytes_read_ = 0;
  int next_ = 0;  // the request the next write uses (round robin keeps them in order)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request*> queue_;
  bool stop_ = false;
  std::string write_error_;  // the first failed write's message, reported once
  std::thread io_;
};

}  // namespace so
