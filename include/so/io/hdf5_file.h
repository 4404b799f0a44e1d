#pragma once
// Thin RAII layer over the HDF5 C API: every hid_t has an owner, every failure names the file
// and the object. Used for fixtures, HDF5 token datasets and (later) checkpoints.
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace so {

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
  static H5File open_read(const std::string& path);
  const std::string& path() const { return path_; }

  bool exists(const std::string& object) const;
  std::vector<int64_t> shape(const std::string& dataset) const;
  // The stored element type: whether it is an integer type, and in words ("32-bit float", ...).
  bool is_integer(const std::string& dataset) const;
  std::string type_description(const std::string& dataset) const;
  std::vector<float> read_f32(const std::string& dataset) const;
  std::vector<double> read_f64(const std::string& dataset) const;
  std::vector<int32_t> read_i32(const std::string& dataset) const;
  // Reads count elements starting at flat element `offset` of a 1-D integer dataset.
  void read_i32_range(const std::string& dataset, int64_t offset, int64_t count, int32_t* out) const;
  std::string read_string_attr(const std::string& object, const std::string& name) const;
  double read_double_attr(const std::string& object, const std::string& name) const;
  std::vector<std::string> members(const std::string& group) const;

 private:
  H5Id open_dataset(const std::string& dataset) const;
  std::string path_;
  H5Id file_;
};

}  // namespace so
