#include "so/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "so/core/error.h"
#include "so/core/json_reader.h"
#include "so/io/atomic_file.h"

namespace so {

// Tensor data is copied as it lies in the file: the format is little-endian.
static_assert(std::endian::native == std::endian::little);

namespace {

// The reference implementation's limit: a larger header is refused before it is parsed.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr char kMetadataKey[] = "__metadata__";

struct DTypeName {
  const char* name;
  SafetensorsDType dtype;
};
constexpr DTypeName kReadable[] = {{"F32", SafetensorsDType::F32},
                                   {"BF16", SafetensorsDType::BF16},
                                   {"F16", SafetensorsDType::F16},
                                   {"U8", SafetensorsDType::U8}};

size_t element_size(SafetensorsDType t) { return t == SafetensorsDType::F32 ? 4 : t == SafetensorsDType::U8 ? 1 : 2; }

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

nlohmann::json parse_header(const std::string& path, const char* text, size_t n) {
  // Bounded nesting and no duplicate keys: two entries for one tensor must not disagree unseen.
  nlohmann::json j = parse_json_text(std::string_view(text, n), str_cat("safetensors file '", path, "': the header"));
  SO_CHECK(j.is_object(), "safetensors file '", path, "': the header must be a JSON object, is ", j.type_name());
  return j;
}

// A non-negative JSON integer; `what` names it in errors.
uint64_t unsigned_value(const nlohmann::json& v, const std::string& what) {
  SO_CHECK(v.is_number_unsigned(), what, " must be a non-negative integer, is ", brief_json(v));
  return v.get<uint64_t>();
}

// One header entry, validated: `where` names the file and the tensor in errors; data_bytes is
// the size of the data section.
SafetensorsTensor parse_tensor(const std::string& where, const std::string& name, const nlohmann::json& entry,
                               uint64_t data_bytes) {
  SO_CHECK(entry.is_object(), where, " must be an object, is ", entry.type_name());
  for (const auto& [key, value] : entry.items())
    SO_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", where, " has the unknown key '", key, "'");
  SO_CHECK(entry.contains("dtype") && entry.contains("shape") && entry.contains("data_offsets"), where,
           " needs dtype, shape and data_offsets");
  SafetensorsTensor t;
  t.name = name;
  const nlohmann::json& dt = entry["dtype"];
  SO_CHECK(dt.is_string(), where, ": dtype must be a string, is ", brief_json(dt));
  const auto known = std::find_if(std::begin(kReadable), std::end(kReadable),
                                  [&](const DTypeName& d) { return dt.get<std::string>() == d.name; });
  SO_CHECK(known != std::end(kReadable), where, " has dtype ", dt.get<std::string>(),
           "; so_train reads F32, BF16, F16 and U8");
  t.dtype = known->dtype;

  const nlohmann::json& shape = entry["shape"];
  SO_CHECK(shape.is_array(), where, ": shape must be an array, is ", brief_json(shape));
  uint64_t numel = 1;
  for (const nlohmann::json& d : shape) {
    const uint64_t dim = unsigned_value(d, where + ": every shape dimension");
    // Bounded by the data section below; here only the product must not wrap.
    SO_CHECK(dim <= INT64_MAX && !__builtin_mul_overflow(numel, dim, &numel) && numel <= INT64_MAX, where, ": shape ",
             brief_json(shape), " has more elements than fit 63 bits");
    t.shape.push_back(static_cast<int64_t>(dim));
  }
  t.numel = static_cast<int64_t>(numel);
  uint64_t bytes = 0;
  SO_CHECK(!__builtin_mul_overflow(numel, element_size(t.dtype), &bytes), where, ": shape ", brief_json(shape),
           " overflows the byte count");

  const nlohmann::json& off = entry["data_offsets"];
  SO_CHECK(off.is_array() && off.size() == 2, where, ": data_offsets must be [begin, end], is ", brief_json(off));
  t.begin = unsigned_value(off[0], where + ": data_offsets begin");
  t.end = unsigned_value(off[1], where + ": data_offsets end");
  SO_CHECK(t.begin <= t.end && t.end <= data_bytes, where, ": data_offsets [", t.begin, ", ", t.end,
           "] lie outside the ", data_bytes, "-byte data section (truncated or corrupt file)");
  SO_CHECK(t.end - t.begin == bytes, where, ": data_offsets [", t.begin, ", ", t.end, "] hold ", t.end - t.begin,
           " bytes but shape ", brief_json(shape), " of ", known->name, " needs ", bytes);
  return t;
}

}  // namespace

const char* safetensors_dtype_name(SafetensorsDType t) {
  for (const DTypeName& d : kReadable)
    if (d.dtype == t) return d.name;
  return "?";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const size_t size = file_.size();
  SO_CHECK(size >= 8, "safetensors file '", path, "' is ", size, " bytes, shorter than the 8-byte header length");
  const uint64_t n = read_le64(file_.data());
  SO_CHECK(n <= size - 8, "safetensors file '", path, "': header length ", n, " runs past the end of the ", size,
           "-byte file (truncated or not a safetensors file)");
  SO_CHECK(n <= kMaxHeaderBytes, "safetensors file '", path, "': header length ", n, " exceeds the limit of ",
           kMaxHeaderBytes, " bytes");
  data_start_ = 8 + static_cast<size_t>(n);
  const uint64_t data_bytes = size - data_start_;
  const nlohmann::json header = parse_header(path, reinterpret_cast<const char*>(file_.data()) + 8, n);

  for (const auto& [name, entry] : header.items()) {
    const std::string where = str_cat("safetensors file '", path, "': tensor '", name, "'");
    if (name == kMetadataKey) {
      SO_CHECK(entry.is_object(), "safetensors file '", path, "': '", kMetadataKey, "' must be an object");
      for (const auto& [key, value] : entry.items()) {
        SO_CHECK(value.is_string(), "safetensors file '", path, "': metadata '", key, "' must be a string, is ",
                 brief_json(value));
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    tensors_.push_back(parse_tensor(where, name, entry, data_bytes));
  }

  // As the reference reader requires: the tensors tile the data section exactly, in offset
  // order, with no overlap, no gap and nothing after the last one.
  std::sort(tensors_.begin(), tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const SafetensorsTensor& t = tensors_[i];
    SO_CHECK(t.begin >= covered, "safetensors file '", path, "': tensor '", t.name, "' (bytes [", t.begin, ", ", t.end,
             ")) overlaps tensor '", tensors_[i - 1].name, "' (bytes [", tensors_[i - 1].begin, ", ",
             tensors_[i - 1].end, "))");
    SO_CHECK(t.begin == covered, "safetensors file '", path, "': bytes [", covered, ", ", t.begin,
             ") of the data section belong to no tensor (before tensor '", t.name, "')");
    covered = t.end;
    index_[t.name] = i;
  }
  SO_CHECK(covered == data_bytes, "safetensors file '", path, "': the data section has ", data_bytes,
           " bytes but its tensors end at byte ", covered);
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafetensorsTensor& SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsTensor* t = find(name);
  SO_CHECK(t, "safetensors file '", path(), "' has no tensor '", name, "'");
  return *t;
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const SafetensorsTensor& t = tensor(name);
  SO_CHECK(t.dtype != SafetensorsDType::U8, "safetensors file '", path(), "': tensor '", name,
           "' holds U8 bytes, not floating-point values");
  const uint8_t* src = file_.data() + data_start_ + t.begin;  // validated at open
  std::vector<float> out(static_cast<size_t>(t.numel));
  if (out.empty()) return out;  // (an empty file maps to no memory at all)
  if (t.dtype == SafetensorsDType::F32) {
    std::memcpy(out.data(), src, out.size() * 4);
    return out;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);  // the data section need not be aligned
    out[i] = t.dtype == SafetensorsDType::BF16 ? bf16_to_f32(bf16{h}) : f16_to_f32(h);
  }
  return out;
}

std::vector<uint8_t> SafetensorsFile::read_u8(const std::string& name) const {
  const SafetensorsTensor& t = tensor(name);
  SO_CHECK(t.dtype == SafetensorsDType::U8, "safetensors file '", path(), "': tensor '", name, "' is ",
           safetensors_dtype_name(t.dtype), "; U8 expected");
  if (t.numel == 0) return {};                                // (an empty file maps to no memory at all)
  const uint8_t* src = file_.data() + data_start_ + t.begin;  // validated at open
  return std::vector<uint8_t>(src, src + t.numel);
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors, DType dtype,
                       const std::function<std::vector<float>(size_t index)>& values,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  const size_t esize = dtype_size(dtype);
  std::vector<int64_t> numels;
  uint64_t offset = 0;
  for (const SafetensorsEntry& t : tensors) {
    SO_CHECK(t.name != kMetadataKey && !header.contains(t.name), "writing safetensors file '", path, "': tensor name '",
             t.name, "' is reserved or given twice");
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      SO_CHECK(d >= 0, "writing safetensors file '", path, "': tensor '", t.name, "' has a negative dimension");
      numel *= d;
    }
    numels.push_back(numel);
    const uint64_t end = offset + static_cast<uint64_t>(numel) * esize;
    header[t.name] = {
        {"dtype", dtype == DType::F32 ? "F32" : "BF16"}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  // Spaces after the JSON pad the header to a multiple of 8 bytes, so the data section starts
  // aligned, as the format recommends.
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  AtomicFileWriter out(path);
  out.write(len, 8);
  out.write(text.data(), text.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::vector<float> v = values(i);
    SO_CHECK(static_cast<int64_t>(v.size()) == numels[i], "writing safetensors file '", path, "': tensor '",
             tensors[i].name, "' has ", v.size(), " values; its shape needs ", numels[i]);
    if (dtype == DType::F32) {
      out.write(v.data(), v.size() * 4);
      continue;
    }
    std::vector<bf16> b(v.size());
    std::transform(v.begin(), v.end(), b.begin(), f32_to_bf16);
    out.write(b.data(), b.size() * 2);
  }
  out.commit();
}

}  // namespace so
