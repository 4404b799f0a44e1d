#include "so/io/hdf5_file.h"

#include <sys/stat.h>

#include <algorithm>
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

std::string shape_text(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "scalar";
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The extent of a dataspace ({} for a scalar); `what` names it in errors.
std::vector<int64_t> extent_of(hid_t space, const std::string& what) {
  const H5S_class_t cls = quietly([&] { return H5Sget_simple_extent_type(space); });
  SO_CHECK(cls == H5S_SCALAR || cls == H5S_SIMPLE, what, " has an empty or unreadable dataspace");
  const int rank = H5Sget_simple_extent_ndims(space);
  SO_CHECK(rank >= 0 && rank <= H5S_MAX_RANK, what, " has an unreadable rank");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  SO_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr) == rank, what, " has unreadable dimensions");
  return std::vector<int64_t>(dims.begin(), dims.end());
}

// Refuses, naming both, an extent other than `want` before anything is read into a buffer sized by it.
void check_extent(hid_t space, const std::vector<int64_t>& want, const std::string& what) {
  const std::vector<int64_t> got = extent_of(space, what);
  SO_CHECK(got == want, what, " has shape ", shape_text(got), ", expected ", shape_text(want));
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
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
  f.file_ = H5Id(quietly([&] { return H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT); }));
  SO_CHECK(f.file_.valid(), "cannot open HDF5 file '", path, "' (not HDF5, truncated or damaged)");
  return f;
}

bool H5File::exists(const std::string& object) const {
  return quietly([&] { return H5Lexists(file_.get(), object.c_str(), H5P_DEFAULT); }) > 0;
}

bool H5File::has_attr(const std::string& object, const std::string& name) const {
  return quietly([&] { return H5Aexists_by_name(file_.get(), object.c_str(), name.c_str(), H5P_DEFAULT); }) > 0;
}

H5Id H5File::open_dataset(const std::string& dataset) const {
  H5Id d(quietly([&] { return H5Dopen2(file_.get(), dataset.c_str(), H5P_DEFAULT); }));
  SO_CHECK(d.valid(), path_, ": no dataset '", dataset, "'");
  return d;
}

H5Id H5File::open_attr(const std::string& object, const std::string& name) const {
  H5Id a(quietly([&] { return H5Aopen_by_name(file_.get(), object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT); }));
  SO_CHECK(a.valid(), path_, ": no attribute '", name, "' on '", object, "'");
  return a;
}

std::vector<int64_t> H5File::shape(const std::string& dataset) const {
  H5Id d = open_dataset(dataset);
  H5Id space(H5Dget_space(d.get()));
  return extent_of(space.get(), str_cat(path_, ": dataset '", dataset, "'"));
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

// A whole dataset of class `cls` and exactly `shape`, converted by HDF5 to the native type T.
template <typename T>
static std::vector<T> read_whole(const H5File& f, H5Id d, const std::string& dataset, const std::vector<int64_t>& shape,
                                 H5T_class_t cls, hid_t mem_type, const char* type_name) {
  const std::string what = str_cat(f.path(), ": dataset '", dataset, "'");
  H5Id type(H5Dget_type(d.get()));
  SO_CHECK(H5Tget_class(type.get()) == cls, what, " holds ", f.type_description(dataset), ", not ",
           cls == H5T_FLOAT ? "floats" : "integers");
  H5Id space(H5Dget_space(d.get()));
  check_extent(space.get(), shape, what);
  std::vector<T> out(static_cast<size_t>(numel(shape)));
  SO_CHECK(quietly([&] { return H5Dread(d.get(), mem_type, space.get(), space.get(), H5P_DEFAULT, out.data()); }) >= 0,
           what, ": reading it as ", type_name, " failed (damaged file)");
  return out;
}

std::vector<float> H5File::read_f32(const std::string& dataset, const std::vector<int64_t>& shape) const {
  return read_whole<float>(*this, open_dataset(dataset), dataset, shape, H5T_FLOAT, H5T_NATIVE_FLOAT, "float32");
}

std::vector<double> H5File::read_f64(const std::string& dataset, const std::vector<int64_t>& shape) const {
  return read_whole<double>(*this, open_dataset(dataset), dataset, shape, H5T_FLOAT, H5T_NATIVE_DOUBLE, "float64");
}

std::vector<int32_t> H5File::read_i32(const std::string& dataset, const std::vector<int64_t>& shape) const {
  return read_whole<int32_t>(*this, open_dataset(dataset), dataset, shape, H5T_INTEGER, H5T_NATIVE_INT32, "int32");
}

void H5File::read_i32_range(const std::string& dataset, int64_t offset, int64_t count, int32_t* out) const {
  read_i32_slab(dataset, 1, offset, count, out);
}

void H5File::read_i32_rows(const std::string& dataset, int64_t first_row, int64_t rows, int32_t* out) const {
  read_i32_slab(dataset, 2, first_row, rows, out);
}

void H5File::read_i32_slab(const std::string& dataset, int rank, int64_t first, int64_t count, int32_t* out) const {
  const std::string what = str_cat(path_, ": dataset '", dataset, "'");
  H5Id d = open_dataset(dataset);
  H5Id type(H5Dget_type(d.get()));
  SO_CHECK(H5Tget_class(type.get()) == H5T_INTEGER, what, " holds ", type_description(dataset), ", not integers");
  H5Id space(H5Dget_space(d.get()));
  const std::vector<int64_t> dims = extent_of(space.get(), what);
  SO_CHECK(static_cast<int>(dims.size()) == rank, what, " must be ", rank, "-D, has shape ", shape_text(dims));
  SO_CHECK(first >= 0 && count >= 0 && first <= dims[0] && count <= dims[0] - first, what, ": ",
           rank == 1 ? "elements" : "rows", " [", first, ", ", first + count, ") lie outside its ", dims[0]);
  if (count == 0) return;
  std::vector<hsize_t> start(rank, 0), n(dims.begin(), dims.end());
  start[0] = static_cast<hsize_t>(first);
  n[0] = static_cast<hsize_t>(count);
  SO_CHECK(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, n.data(), nullptr) >= 0, what,
           ": bad range [", first, ", ", first + count, ")");
  H5Id mem(H5Screate_simple(rank, n.data(), nullptr));
  SO_CHECK(quietly([&] { return H5Dread(d.get(), H5T_NATIVE_INT32, mem.get(), space.get(), H5P_DEFAULT, out); }) >= 0,
           what, ": reading [", first, ", ", first + count, ") failed (damaged file)");
}

namespace {
// The usual names of registered third-party filters, for a file whose pipeline records none.
const char* filter_name(H5Z_filter_t id) {
  switch (id) {
    case H5Z_FILTER_DEFLATE: return "gzip";
    case H5Z_FILTER_SHUFFLE: return "shuffle";
    case H5Z_FILTER_FLETCHER32: return "fletcher32";
    case H5Z_FILTER_SZIP: return "szip";
    case H5Z_FILTER_NBIT: return "nbit";
    case H5Z_FILTER_SCALEOFFSET: return "scaleoffset";
    case 32000: return "lzf";
    case 32001: return "blosc";
    case 32004: return "lz4";
    case 32008: return "bitshuffle";
    case 32015: return "zstd";
    default: return "unknown";
  }
}
}  // namespace

void H5File::check_stored(const std::string& dataset) const {
  const std::string what = str_cat(path_, ": dataset '", dataset, "'");
  H5Id d = open_dataset(dataset);
  H5Id space(H5Dget_space(d.get()));
  const std::vector<int64_t> dims = extent_of(space.get(), what);
  H5Id plist(H5Dget_create_plist(d.get()));
  const H5D_layout_t layout = H5Pget_layout(plist.get());
  // Data kept elsewhere reads as the fill value wherever the other file is missing or short.
  SO_CHECK(layout == H5D_COMPACT || layout == H5D_CONTIGUOUS || layout == H5D_CHUNKED, what,
           " is a virtual dataset (its data lives in other files); store the data in this file (h5repack)");
  SO_CHECK(H5Pget_external_count(plist.get()) == 0, what,
           " keeps its data in external files; store the data in this file (h5repack)");
  const int filters = H5Pget_nfilters(plist.get());
  SO_CHECK(filters >= 0, what, ": its filter pipeline is unreadable");
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0;
    size_t n_values = 0;
    char name[64] = {};
    const H5Z_filter_t id =
        H5Pget_filter2(plist.get(), static_cast<unsigned>(i), &flags, &n_values, nullptr, sizeof(name), name, &config);
    SO_CHECK(id >= 0, what, ": filter ", i, " of its pipeline is unreadable");
    SO_CHECK(quietly([&] { return H5Zfilter_avail(id); }) > 0, what, " is compressed with the HDF5 filter '",
             name[0] ? name : filter_name(id), "' (id ", id,
             "), which this build's HDF5 library cannot decode: rewrite it "
             "uncompressed or with gzip (h5repack -f GZIP=4)");
  }
  if (numel(dims) == 0) return;
  if (layout == H5D_CHUNKED) {
    // Compressed chunks are smaller than their extent, so HDF5's space status calls a dataset
    // whose every chunk is written "partly allocated": count the chunks instead.
    std::vector<hsize_t> chunk(dims.size());
    SO_CHECK(H5Pget_chunk(plist.get(), static_cast<int>(chunk.size()), chunk.data()) == static_cast<int>(chunk.size()),
             what, ": its chunk shape is unreadable");
    unsigned __int128 expected = 1;
    for (size_t i = 0; i < dims.size(); ++i) {
      SO_CHECK(chunk[i] > 0, what, ": a chunk dimension is 0");
      expected *= (static_cast<uint64_t>(dims[i]) + chunk[i] - 1) / chunk[i];
      expected = std::min<unsigned __int128>(expected, UINT64_MAX);  // dims < 2^64 each: no wrap before this
    }
    hsize_t written = 0;
    SO_CHECK(H5Dget_num_chunks(d.get(), space.get(), &written) >= 0, what, ": its chunk index is unreadable");
    SO_CHECK(written == expected, what, " of shape ", shape_text(dims), " was ",
             written == 0
                 ? "declared but never written"
                 : str_cat("only partly written (", written, " of its ", static_cast<uint64_t>(expected), " chunks)"),
             " (HDF5 would hand back its fill value, zeros, for what is missing): write it completely");
    return;
  }
  H5D_space_status_t status;
  SO_CHECK(H5Dget_space_status(d.get(), &status) >= 0, what, ": storage status unreadable");
  SO_CHECK(status == H5D_SPACE_STATUS_ALLOCATED, what, " of shape ", shape_text(dims), " was ",
           status == H5D_SPACE_STATUS_NOT_ALLOCATED ? "declared but never written" : "only partly written",
           " (HDF5 would hand back its fill value, zeros, for what is missing): write it completely");
}

std::string H5File::read_string(const std::string& dataset, size_t max_bytes) const {
  const std::string what = str_cat(path_, ": dataset '", dataset, "'");
  H5Id d = open_dataset(dataset);
  H5Id type(H5Dget_type(d.get()));
  SO_CHECK(H5Tget_class(type.get()) == H5T_STRING && H5Tis_variable_str(type.get()) == 0, what,
           " is not a fixed-length string");
  const size_t bytes = H5Tget_size(type.get());
  SO_CHECK(bytes > 0 && bytes <= max_bytes, what, " is a string of ", bytes, " bytes (at most ", max_bytes, ")");
  H5Id space(H5Dget_space(d.get()));
  check_extent(space.get(), {}, what);
  std::string out(bytes, '\0');
  SO_CHECK(
      quietly([&] { return H5Dread(d.get(), type.get(), space.get(), space.get(), H5P_DEFAULT, out.data()); }) >= 0,
      what, ": reading it failed (truncated or damaged file)");
  return out.substr(0, out.find('\0'));
}

std::string H5File::read_string_attr(const std::string& object, const std::string& name) const {
  const std::string what = str_cat(path_, ": attribute '", name, "' of '", object, "'");
  H5Id attr = open_attr(object, name);
  H5Id type(H5Aget_type(attr.get()));
  SO_CHECK(H5Tget_class(type.get()) == H5T_STRING, what, " is not a string");
  H5Id space(H5Aget_space(attr.get()));
  check_extent(space.get(), {}, what);
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Id mem(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* s = nullptr;
    SO_CHECK(quietly([&] { return H5Aread(attr.get(), mem.get(), &s); }) >= 0, what, ": reading it failed");
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  std::string out(H5Tget_size(type.get()), '\0');
  SO_CHECK(quietly([&] { return H5Aread(attr.get(), type.get(), out.data()); }) >= 0, what, ": reading it failed");
  return out.substr(0, out.find('\0'));
}

double H5File::read_double_attr(const std::string& object, const std::string& name) const {
  const std::string what = str_cat(path_, ": attribute '", name, "' of '", object, "'");
  H5Id attr = open_attr(object, name);
  H5Id type(H5Aget_type(attr.get()));
  const H5T_class_t cls = H5Tget_class(type.get());
  SO_CHECK(cls == H5T_FLOAT || cls == H5T_INTEGER, what, " is not a number");
  H5Id space(H5Aget_space(attr.get()));
  check_extent(space.get(), {}, what);
  double v = 0;
  SO_CHECK(quietly([&] { return H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v); }) >= 0, what, ": reading it failed");
  return v;
}

int64_t H5File::read_int_attr(const std::string& object, const std::string& name) const {
  const std::string what = str_cat(path_, ": attribute '", name, "' of '", object, "'");
  H5Id attr = open_attr(object, name);
  H5Id type(H5Aget_type(attr.get()));
  SO_CHECK(H5Tget_class(type.get()) == H5T_INTEGER, what, " is not an integer");
  // A 64-bit unsigned value past INT64_MAX would be clipped by the conversion, not refused.
  SO_CHECK(H5Tget_size(type.get()) < 8 || H5Tget_sign(type.get()) != H5T_SGN_NONE, what,
           " is a 64-bit unsigned integer");
  H5Id space(H5Aget_space(attr.get()));
  check_extent(space.get(), {}, what);
  int64_t v = 0;
  SO_CHECK(quietly([&] { return H5Aread(attr.get(), H5T_NATIVE_INT64, &v); }) >= 0, what, ": reading it failed");
  return v;
}

std::vector<std::string> H5File::members(const std::string& group) const {
  H5Id g(quietly([&] { return H5Gopen2(file_.get(), group.c_str(), H5P_DEFAULT); }));
  SO_CHECK(g.valid(), path_, ": no group '", group, "'");
  H5G_info_t info;
  SO_CHECK(H5Gget_info(g.get(), &info) >= 0, path_, ": cannot list group '", group, "'");
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    SO_CHECK(len >= 0, path_, ": cannot read the name of member ", i, " of group '", group, "'");
    std::string name(static_cast<size_t>(len), '\0');
    H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), static_cast<size_t>(len) + 1,
                       H5P_DEFAULT);
    names.push_back(name);
  }
  return names;
}

H5File::Contiguous H5File::contiguous(const std::string& dataset, hid_t type, const char* type_name) const {
  const std::string what = str_cat(path_, ": dataset ", dataset);
  H5Id d = open_dataset(dataset);
  H5Id stored(H5Dget_type(d.get()));
  SO_CHECK(H5Tequal(stored.get(), type) > 0, what, " is not ", type_name);
  H5Id plist(H5Dget_create_plist(d.get()));
  SO_CHECK(H5Pget_layout(plist.get()) == H5D_CONTIGUOUS && H5Pget_nfilters(plist.get()) == 0 &&
               H5Pget_external_count(plist.get()) == 0,
           what, " is not stored contiguously without filters in this file");
  H5Id space(H5Dget_space(d.get()));
  Contiguous c;
  c.shape = extent_of(space.get(), what);
  c.offset = H5Dget_offset(d.get());
  return c;
}

uint64_t H5File::end_of_allocation() const {
  haddr_t eoa = HADDR_UNDEF;
  SO_CHECK(H5Fget_eoa(file_.get(), &eoa) >= 0 && eoa != HADDR_UNDEF, path_, ": cannot read HDF5's end of allocation");
  // Addresses inside HDF5 are relative to the end of the userblock; dataset offsets are absolute.
  H5Id fcpl(H5Fget_create_plist(file_.get()));
  hsize_t userblock = 0;
  SO_CHECK(H5Pget_userblock(fcpl.get(), &userblock) >= 0, path_, ": cannot read the userblock size");
  return static_cast<uint64_t>(userblock) + eoa;
}

uint64_t H5File::size() const {
  hsize_t bytes = 0;
  SO_CHECK(H5Fget_filesize(file_.get(), &bytes) >= 0, path_, ": cannot read the file size");
  return bytes;
}

}  // namespace so
