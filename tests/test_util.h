#pragma once
// Helpers shared by the tests: relative error, device upload/download through a backend, errors.
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "so/backend/backend.h"
#include "so/core/error.h"

namespace so::test {

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // (An empty vector's data() may be null, which memcmp must not see even with a zero length.)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The CPU backend whatever the machine has ("auto" takes a GPU where one is visible): for the
// tests of CPU semantics. Their GPU counterparts live in tests/gpu/.
inline BackendOptions cpu_backend_options() {
  BackendOptions o;
  o.type = "cpu";
  return o;
}

// ||a - b|| / ||b||, in double.
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The worst rel_error over a list of tensors (e.g. every parameter of a model).
inline double worst_rel_error(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, rel_error(a[i], b[i]));
  return worst;
}

// Device buffer holding `values` converted to dtype dt.
inline DeviceBuffer upload(Backend& be, const std::vector<float>& values, DType dt) {
  DeviceBuffer wide = be.alloc(values.size() * 4, "test upload");
  DeviceBuffer out = be.alloc(values.size() * dtype_size(dt), "test tensor");
  Stream& s = be.stream(StreamKind::Compute);
  be.copy_h2d(wide.data(), values.data(), values.size() * 4, s);
  be.ops().cast(s, out.data(), dt, wide.data(), DType::F32, static_cast<int64_t>(values.size()));
  be.synchronize(s);
  return out;
}

// Device buffer holding a RoPE frequency table (fp64), as the rope op reads it.
inline DeviceBuffer upload_f64(Backend& be, const std::vector<double>& values) {
  DeviceBuffer out = be.alloc(values.size() * sizeof(double), "test f64 upload");
  Stream& s = be.stream(StreamKind::Compute);
  be.copy_h2d(out.data(), values.data(), values.size() * sizeof(double), s);
  be.synchronize(s);
  return out;
}

inline std::vector<float> download(Backend& be, const void* dev, size_t n, DType dt) {
  DeviceBuffer wide = be.alloc(n * 4, "test download");
  Stream& s = be.stream(StreamKind::Compute);
  be.ops().cast(s, wide.data(), DType::F32, dev, dt, static_cast<int64_t>(n));
  std::vector<float> out(n);
  be.copy_d2h(out.data(), wide.data(), n * 4, s);
  be.synchronize(s);
  return out;
}

// The message of the so::Error that fn throws; empty when it throws none.
template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A fresh directory under the system's temporary directory, unique to this process and `name`
// (e.g. the test's name), removed with its contents when it goes out of scope.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / str_cat("so_test_", ::getpid(), "_", name)) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace so::test
