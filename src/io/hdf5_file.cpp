#include "so/io/hdf5_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "so/core/error.h"

namespace so {

namespace {
void close_id(hid_t id) {
  if (id < 0) return;
  switch (H5Iget_type(id)) {
    case H5I_FILE: H5Fclose(id); break;
    case H5I_GROUP: H5Gclose(id); break;
    case H5I_DATASET: H5Dclose(id); break;
    case H5I_DATASPACE: H5Sclose(id); break;
    case H5I_DATATYPE: H5Tclose(id); break;
    case H5I_ATTR: H5Aclose(id); break;
    case H5I_GENPROP_LST: H5Pclose(id); break;
    default: H5Idec_ref(id); break;
  }
}
}  // namespace

H5Id& H5Id::operator=(H5Id&& o) noexcept {
  if (this != &o) {
    close_id(id_);
    id_ = o.id_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

H5Id::~H5Id() { close_id(id_); }

H5File H5File::open_read(const std::string& path) {
  H5File f;
  f.path_ = path;
  // H5Fopen would block on a FIFO (waiting for a writer) and misreport a directory.
  struct stat st {};
  SO_CHECK(::stat(path.c_str(), &st) == 0, "cannot open HDF5 file '", path, "': ", std::strerror(errno));
  SO_CHECK(S_ISREG(st.st_mode), "HDF5 file '", path, "' is not a regular file (a directory, FIFO or device)");
  H5E_BEGIN_TRY { f.file_ = H5Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)); }
  H5E_END_TRY;
  SO_CHECK(f.file_.valid(), "cannot open HDF5 file '", path, "' (missing, unreadable or not HDF5)");
  return f;
}

bool H5File::exists(const std::string& object) const {
  htri_t r;
  H5E_BEGIN_TRY { r = H5Lexists(file_.get(), object.c_str(), H5P_DEFAULT); }
  H5E_END_TRY;
  return r > 0;
}

H5Id H5File::open_dataset(const std::string& dataset) const {
  H5Id d;
  H5E_BEGIN_TRY { d = H5Id(H5Dopen2(file_.get(), dataset.c_str(), H5P_DEFAULT)); }
  H5E_END_TRY;
  SO_CHECK(d.valid(), path_, ": no dataset '", dataset, "'");
  return d;
}

std::vector<int64_t> H5File::shape(const std::string& dataset) const {
  H5Id d = open_dataset(dataset);
  H5Id space(H5Dget_space(d.get()));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  SO_CHECK(rank >= 0, path_, ": cannot read the shape of '", dataset, "'");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return std::vector<int64_t>(dims.begin(), dims.end());
}

bool H5File::is_integer(const std::string& dataset) const {
  H5Id d = open_dataset(dataset);
  H5Id type(H5Dget_type(d.get()));
  return H5Tget_class(type.get()) == H5T_INTEGER;
}

std::string H5File::type_description(const std::string& dataset) const {
  H5Id d = open_dataset(dataset);
  H5Id type(H5Dget_type(d.get()));
  const size_t bits = 8 * H5Tget_size(type.get());
  switch (H5Tget_class(type.get())) {
    case H5T_INTEGER:
      return str_cat(bits, "-bit ", H5Tget_sign(type.get()) == H5T_SGN_NONE ? "unsigned" : "signed", " integers");
    case H5T_FLOAT: return str_cat(bits, "-bit floats");
    case H5T_STRING: return "strings";
    default: return str_cat(bits, "-bit values of a non-numeric HDF5 class");
  }
}

namespace {
int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
}  // namespace

// Whole-dataset read converted by HDF5 to the native type T.
template <typename T>
static std::vector<T> read_all(const H5File& f, const H5Id& d, int64_t n, hid_t mem_type, const std::string& dataset,
                               const char* type_name) {
  std::vector<T> out(static_cast<size_t>(n));
  SO_CHECK(H5Dread(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0, f.path(), ": reading '",
           dataset, "' as ", type_name, " failed");
  return out;
}

std::vector<float> H5File::read_f32(const std::string& dataset) const {
  return read_all<float>(*this, open_dataset(dataset), numel(shape(dataset)), H5T_NATIVE_FLOAT, dataset, "float32");
}

std::vector<double> H5File::read_f64(const std::string& dataset) const {
  return read_all<double>(*this, open_dataset(dataset), numel(shape(dataset)), H5T_NATIVE_DOUBLE, dataset, "float64");
}

std::vector<int32_t> H5File::read_i32(const std::string& dataset) const {
  return read_all<int32_t>(*this, open_dataset(dataset), numel(shape(dataset)), H5T_NATIVE_INT32, dataset, "int32");
}

void H5File::read_i32_range(const std::string& dataset, int64_t offset, int64_t count, int32_t* out) const {
  H5Id d = open_dataset(dataset);
  H5Id space(H5Dget_space(d.get()));
  SO_CHECK(H5Sget_simple_extent_ndims(space.get()) == 1, path_, ": dataset '", dataset, "' must be 1-D");
  hsize_t start = static_cast<hsize_t>(offset), n = static_cast<hsize_t>(count);
  SO_CHECK(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr) >= 0, path_,
           ": bad range [", offset, ", ", offset + count, ") of '", dataset, "'");
  H5Id mem(H5Screate_simple(1, &n, nullptr));
  SO_CHECK(H5Dread(d.get(), H5T_NATIVE_INT32, mem.get(), space.get(), H5P_DEFAULT, out) >= 0, path_,
           ": reading [", offset, ", ", offset + count, ") of '", dataset, "' failed");
}

std::string H5File::read_string_attr(const std::string& object, const std::string& name) const {
  H5Id attr;
  H5E_BEGIN_TRY { attr = H5Id(H5Aopen_by_name(file_.get(), object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT)); }
  H5E_END_TRY;
  SO_CHECK(attr.valid(), path_, ": no attribute '", name, "' on '", object, "'");
  H5Id type(H5Aget_type(attr.get()));
  SO_CHECK(H5Tget_class(type.get()) == H5T_STRING, path_, ": attribute '", name, "' is not a string");
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Id mem(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* s = nullptr;
    SO_CHECK(H5Aread(attr.get(), mem.get(), &s) >= 0, path_, ": reading attribute '", name, "' failed");
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  const size_t size = H5Tget_size(type.get());
  std::string out(size, '\0');
  SO_CHECK(H5Aread(attr.get(), type.get(), out.data()) >= 0, path_, ": reading attribute '", name, "' failed");
  return out.substr(0, out.find('\0'));
}

double H5File::read_double_attr(const std::string& object, const std::string& name) const {
  H5Id attr;
  H5E_BEGIN_TRY { attr = H5Id(H5Aopen_by_name(file_.get(), object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT)); }
  H5E_END_TRY;
  SO_CHECK(attr.valid(), path_, ": no attribute '", name, "' on '", object, "'");
  double v = 0;
  SO_CHECK(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v) >= 0, path_, ": reading attribute '", name, "' failed");
  return v;
}

std::vector<std::string> H5File::members(const std::string& group) const {
  H5Id g;
  H5E_BEGIN_TRY { g = H5Id(H5Gopen2(file_.get(), group.c_str(), H5P_DEFAULT)); }
  H5E_END_TRY;
  SO_CHECK(g.valid(), path_, ": no group '", group, "'");
  H5G_info_t info;
  H5Gget_info(g.get(), &info);
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    std::string name(static_cast<size_t>(len), '\0');
    H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), len + 1, H5P_DEFAULT);
    names.push_back(name);
  }
  return names;
}

}  // namespace so
