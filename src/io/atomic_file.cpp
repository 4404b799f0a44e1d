#include "so/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "so/core/error.h"

namespace so {

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  // The temporary sits in the same directory (rename is atomic only within a file system) and
  // carries the pid, so concurrent writers of one name do not share it.
  tmp_ = str_cat(path_, ".tmp.", ::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  SO_CHECK(fd_ >= 0, "cannot create '", tmp_, "' (to write '", path_, "'): ", std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  SO_CHECK(fd_ >= 0, "'", path_, "' was already committed");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    SO_CHECK(n > 0, "writing '", tmp_, "' failed: ", std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

namespace {

// rename(2) then an fsync of the directory, so the new name survives a crash.
void rename_durably(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    ::unlink(from.c_str());
    SO_FAIL("cannot move '", from, "' to '", to, "': ", std::strerror(err));
  }
  const std::filesystem::path parent = std::filesystem::absolute(to).parent_path();
  const int dir = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  SO_CHECK(dir >= 0, "cannot open directory '", parent.string(), "': ", std::strerror(errno));
  const int rc = ::fsync(dir);
  ::close(dir);
  SO_CHECK(rc == 0, "fsync of directory '", parent.string(), "' failed");
}

}  // namespace

void AtomicFileWriter::commit() {
  SO_CHECK(fd_ >= 0, "'", path_, "' was already committed");
  SO_CHECK(::fsync(fd_) == 0, "fsync of '", tmp_, "' failed: ", std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    SO_FAIL("closing '", tmp_, "' failed: ", std::strerror(err));
  }
  rename_durably(tmp_, path_);
}

void publish_file(const std::string& written, const std::string& path) {
  const int fd = ::open(written.c_str(), O_RDONLY | O_CLOEXEC);
  SO_CHECK(fd >= 0, "cannot open '", written, "' to sync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  SO_CHECK(rc == 0, "fsync of '", written, "' failed");
  rename_durably(written, path);
}

void write_file_atomically(const std::string& path, const std::string& text) {
  AtomicFileWriter out(path);
  out.write(text.data(), text.size());
  out.commit();
}

}  // namespace so
