#pragma once
// A file written under a temporary name beside its final one and renamed into place only after
// fsync, so the final name never holds a partial file: a crash or an exception leaves either
// the old file or the complete new one. An uncommitted writer removes its temporary.
#include <cstddef>
#include <string>

namespace so {

class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  void write(const void* data, size_t bytes);
  // fsync, close, rename to the final name, fsync the directory (so the rename is durable).
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

// For files another library wrote under a temporary name (HDF5 checkpoints): fsync `written`,
// rename it to `path`, fsync the directory.
void publish_file(const std::string& written, const std::string& path);

// Writes `text` to `path` through an AtomicFileWriter.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace so
