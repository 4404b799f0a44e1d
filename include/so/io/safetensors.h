#pragma once
// Hugging Face's safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// ({name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__": {str: str}})
// and the data section the offsets point into. The reader validates the whole header against
// the file's size when it opens the file, before any tensor is read, and trusts no size or
// offset it read (rules: docs/checkpoints.md); it reads F32, BF16 and F16 and widens them to
// fp32 exactly, and U8 as bytes (MXFP4 blocks and scales). The writer writes F32 or BF16 under a temporary name and
// renames it into place.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "so/core/dtype.h"
#include "so/io/mapped_file.h"

namespace so {

enum class SafetensorsDType { F32, BF16, F16, U8 };
const char* safetensors_dtype_name(SafetensorsDType t);

struct SafetensorsTensor {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::F32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  uint64_t begin = 0, end = 0;  // byte range in the data section
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // maps the file and validates its header

  const std::string& path() const { return file_.path(); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // in data order
  const SafetensorsTensor* find(const std::string& name) const;               // null when absent
  const SafetensorsTensor& tensor(const std::string& name) const;             // fails when absent
  std::vector<float> read_f32(const std::string& name) const;                 // F32, BF16 or F16 (else fails)
  std::vector<uint8_t> read_u8(const std::string& name) const;                // U8 (else fails)

 private:
  MappedFile file_;
  size_t data_start_ = 0;  // 8 + header length
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
};

// Writes `tensors` in order, values(i) giving tensor i's fp32 values (one tensor in memory at a
// time), stored as F32 or BF16 (round to nearest even, as every cast in so_train).
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors, DType dtype,
                       const std::function<std::vector<float>(size_t index)>& values,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace so
