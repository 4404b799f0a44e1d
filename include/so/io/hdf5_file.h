#pragma once
// Thin RAII layer over the HDF5 C API: every hid_t has an owner, every failure names the file
// and the object. The one way this project reads HDF5 (fixtures, token datasets, checkpoints):
// every read states the element class, rank and extent it expects, and anything else is refused
// by name before a byte is read, so no buffer is ever sized by one thing and filled by another.
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace so {

// HDF5 calls that may fail on a damaged file: the error is reported by us, not printed by HDF5.
template <typename Fn>
auto quietly(Fn&& fn) {
  decltype(fn()) r;
  H5E_BEGIN_TRY { r = fn(); }
  H5E_END_TRY;
  return r;
}

// Owns one HDF5 identifier and closes it with the matching H5*close.
class H5Id {
 public:
  H5Id() = default;
  explicit H5Id(hid_t id) : id_(id) {}
  H5Id(H5Id&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  H5Id& operator=(H5Id&& o) noexcept;
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  ~H5Id();
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

class H5File {
 public:
  // A regular file HDF5 can open read-only (a FIFO, directory or device is refused first).
  static H5File open_read(const std::string& path);
  const std::string& path() const { return path_; }

  bool exists(const std::string& object) const;
  bool has_attr(const std::string& object, const std::string& name) const;
  // The dataset's extent ({} for a scalar); an empty (null) dataspace is refused.
  std::vector<int64_t> shape(const std::string& dataset) const;
  // The stored element type: whether it is an integer type, and in words ("32-bit float", ...).
  bool is_integer(const std::string& dataset) const;
  std::string type_description(const std::string& dataset) const;

  // Whole datasets of exactly `shape`, floats (read_f32) or integers (read_i32), converted by HDF5.
  std::vector<float> read_f32(const std::string& dataset, const std::vector<int64_t>& shape) const;
  std::vector<double> read_f64(const std::string& dataset, const std::vector<int64_t>& shape) const;
  std::vector<int32_t> read_i32(const std::string& dataset, const std::vector<int64_t>& shape) const;
  // Reads count elements starting at flat element `offset` of a 1-D integer dataset.
  void read_i32_range(const std::string& dataset, int64_t offset, int64_t count, int32_t* out) const;
  // Reads rows [first_row, first_row + rows) of a 2-D integer dataset, row-major.
  void read_i32_rows(const std::string& dataset, int64_t first_row, int64_t rows, int32_t* out) const;
  // Refuses, by name, a dataset that cannot be read as it was written: data kept outside this file
  // (external files, a virtual dataset), a filter this HDF5 library lacks (lzf, blosc, ...), or
  // storage never (or only partly) written, where HDF5 would read its fill value without a word
  // and token data of zeros would train. Compressed (chunked) data counts its chunks.
  void check_stored(const std::string& dataset) const;
  // A scalar fixed-length string dataset of at most max_bytes, up to its first NUL.
  std::string read_string(const std::string& dataset, size_t max_bytes) const;
  // Scalar attributes: a string (fixed or variable length), a number, an integer.
  std::string read_string_attr(const std::string& object, const std::string& name) const;
  double read_double_attr(const std::string& object, const std::string& name) const;
  int64_t read_int_attr(const std::string& object, const std::string& name) const;
  std::vector<std::string> members(const std::string& group) const;

  // For a reader that reads a dataset's bytes itself (checkpoints, around the page cache): the
  // shape and absolute byte offset of a contiguous, unfiltered dataset stored as exactly `type`
  // (`type_name` in errors); the offset is HADDR_UNDEF where no storage was allocated.
  struct Contiguous {
    std::vector<int64_t> shape;
    haddr_t offset = HADDR_UNDEF;
  };
  Contiguous contiguous(const std::string& dataset, hid_t type, const char* type_name) const;
  // HDF5's own view of the file's end: the userblock plus the end of allocation its superblock
  // records. Bytes beyond it are not part of the file to HDF5 (h5py cannot read them).
  uint64_t end_of_allocation() const;
  // The file's size on disk.
  uint64_t size() const;

 private:
  H5Id open_dataset(const std::string& dataset) const;
  void read_i32_slab(const std::string& dataset, int rank, int64_t first, int64_t count, int32_t* out) const;
  H5Id open_attr(const std::string& object, const std::string& name) const;
  std::string path_;
  H5Id file_;
};

}  // namespace so
