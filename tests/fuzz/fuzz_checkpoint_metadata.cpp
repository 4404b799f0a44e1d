// libFuzzer target: a checkpoint's /metadata document and the HDF5 structure around it.
// An input is the document's text, then (after a NUL, if any) bytes that choose how the file
// holding it is built: /metadata's type and dataspace, its crc32c attribute's type, shape and
// value, the root format/format_version copies, and bytes of the superblock's address fields.
// The document alone goes through ckpt::parse_metadata; the file through CheckpointFile and
// verify_all, which must refuse whatever they cannot read by name, never crash.
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "so/core/error.h"
#include "so/io/crc32c.h"
#include "so/io/hdf5_file.h"
#include "src/checkpoint/checkpoint_file.h"

namespace {

// The structure bytes, read one at a time; 0 once they run out (the well-formed choice).
struct Choices {
  const uint8_t* p;
  size_t n;
  uint8_t next() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
};

// A dataspace: scalar (0), null (1) or 1-D of 0..5 elements.
so::H5Id make_space(uint8_t how) {
  if (how % 8 == 0) return so::H5Id(H5Screate(H5S_SCALAR));
  if (how % 8 == 1) return so::H5Id(H5Screate(H5S_NULL));
  const hsize_t n = how % 8 - 2;
  return so::H5Id(H5Screate_simple(1, &n, nullptr));
}

hssize_t elements(hid_t space) {
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  return n < 0 ? 0 : n;
}

void write_metadata(hid_t f, const std::string& text, Choices& c) {
  so::H5Id type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), std::max<size_t>(1, text.size()));
  const uint8_t kind = c.next();
  if (kind % 4 == 1) type = so::H5Id(H5Tcopy(H5T_STD_U8LE));  // bytes, not a string
  so::H5Id space = make_space(c.next());
  so::H5Id ds(H5Dcreate2(f, "/metadata", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  // Every element holds the text (as much of it as an element holds).
  const size_t each = H5Tget_size(type.get());
  std::string data;
  for (hssize_t i = 0; i < elements(space.get()); ++i)
    data += text.substr(0, each) + std::string(each - std::min(each, text.size()), '\0');
  if (!data.empty()) H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
  const uint8_t attr = c.next();
  if (attr % 8 == 7) return;  // no crc32c
  const hid_t types[] = {H5T_STD_U32LE, H5T_STD_I64LE, H5T_IEEE_F64LE, H5T_STD_U64LE};
  so::H5Id aspace = make_space(c.next());
  so::H5Id a(H5Acreate2(ds.get(), "crc32c", types[attr % 4], aspace.get(), H5P_DEFAULT, H5P_DEFAULT));
  const uint64_t crc = attr & 0x80 ? c.next() : so::crc32c(text.data(), text.size());
  const std::vector<uint64_t> values(static_cast<size_t>(elements(aspace.get())), crc);
  if (!values.empty()) H5Awrite(a.get(), H5T_NATIVE_UINT64, values.data());
}

void write_root_attrs(hid_t f, Choices& c) {
  const uint8_t how = c.next();
  if (how & 1) H5Adelete(f, "format");
  if (how & 2) H5Adelete(f, "format_version");
  if (how & 4) {
    H5Adelete(f, "format_version");
    so::H5Id space = make_space(c.next());
    so::H5Id a(H5Acreate2(f, "format_version", H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
    const std::vector<int64_t> v(static_cast<size_t>(elements(space.get())), c.next());
    if (!v.empty()) H5Awrite(a.get(), H5T_NATIVE_INT64, v.data());
  }
}

// Only the version-0 superblock's base and end-of-file addresses (bytes 24-31, 40-47): HDF5
// 1.10 itself is not hardened against every damaged superblock field, and this target tests ours.
void damage_superblock(const std::string& path, Choices& c) {
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  if (!f) return;
  for (int flips = c.next() % 4; flips > 0; --flips) {
    const uint8_t at = c.next() % 16;
    const long offset = at < 8 ? 24 + at : 40 + (at - 8);
    const uint8_t mask = c.next();
    std::fseek(f, offset, SEEK_SET);
    const int byte = std::fgetc(f);
    if (byte == EOF) break;
    std::fseek(f, offset, SEEK_SET);
    std::fputc(byte ^ mask, f);
  }
  std::fclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string text(input.substr(0, nul));
  Choices c{data + std::min(size, nul + 1), nul == std::string_view::npos ? 0 : size - nul - 1};
  so::CheckpointSummary summary;
  so::ParamLayout layout;
  bool parsed = false;
  try {
    so::ckpt::parse_metadata(text, "fuzz input", summary, layout);
    parsed = true;
  } catch (const so::Error&) {
  }
  // Refusals are reported by the reader; HDF5's own error stack would flood the log.
  static const herr_t quiet = H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  (void)quiet;
  static const std::string path = "/tmp/fuzz_checkpoint_metadata." + std::to_string(::getpid()) + ".h5";
  try {
    // The datasets of the model the document names, allocated, never written (as after a crash).
    std::vector<int64_t> segments;
    std::vector<int> order;
    if (parsed)
      for (size_t i = 0; i < layout.params.size(); ++i) {
        segments.push_back(
            std::max<int64_t>(1, (layout.params[i].numel + so::ckpt::kChunkElements - 1) / so::ckpt::kChunkElements));
        order.push_back(static_cast<int>(i));
      }
    so::ckpt::create_file(path, nlohmann::json::object(), parsed ? layout : so::ParamLayout{}, segments, order);
    {
      so::H5Id f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
      H5Ldelete(f.get(), "/metadata", H5P_DEFAULT);
      write_metadata(f.get(), text, c);
      write_root_attrs(f.get(), c);
    }
    damage_superblock(path, c);
    so::ckpt::CheckpointFile file(path);
    file.verify_all();
  } catch (const so::Error&) {
  }
  ::unlink(path.c_str());
  return 0;
}
