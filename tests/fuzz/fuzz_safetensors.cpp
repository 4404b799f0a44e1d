// libFuzzer target: a whole safetensors file (8-byte header length, JSON header, data) opened by
// SafetensorsFile and every tensor it accepts read back. The input lives in a memfd, so the reader
// maps it exactly as it maps a file on disk.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "so/core/error.h"
#include "so/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("fuzz_safetensors", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ftruncate(fd, 0) != 0 || (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)))
    __builtin_trap();
  try {
    const so::SafetensorsFile f(path);
    for (const so::SafetensorsTensor& t : f.tensors()) f.read_f32(t.name);
  } catch (const so::Error&) {
  }
  return 0;
}
