#include "checkpoint_file.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iterator>

#include "so/core/error.h"
#include "so/core/json_reader.h"
#include "so/io/crc32c.h"
#include "so/io/hdf5_file.h"

namespace so::ckpt {

namespace fs = std::filesystem;

// Data and checksum tables are read and written as the little-endian bytes they are on disk.
static_assert(std::endian::native == std::endian::little);

const TensorGroup kGroups[3] = {{OptimState::Master, "/model"},
                                {OptimState::ExpAvg, "/optim/exp_avg"},
                                {OptimState::ExpAvgSq, "/optim/exp_avg_sq"}};

namespace {

constexpr char kMetadata[] = "/metadata";
constexpr int64_t kMaxMetadataBytes = int64_t{64} << 20;
constexpr int64_t kMaxSteps = int64_t{1} << 40;

#define SO_H5(call, ...) SO_CHECK((call) >= 0, "HDF5: ", #call, " failed: ", __VA_ARGS__)

H5Id check_id(hid_t id, const std::string& what) {
  SO_CHECK(id >= 0, "HDF5: ", what, " failed");
  return H5Id(id);
}

void write_string_attr(hid_t obj, const char* name, const std::string& value) {
  H5Id type = check_id(H5Tcopy(H5T_C_S1), "H5Tcopy");
  SO_H5(H5Tset_size(type.get(), std::max<size_t>(1, value.size())), "string type");
  H5Id space = check_id(H5Screate(H5S_SCALAR), "H5Screate");
  H5Id attr = check_id(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                       str_cat("creating attribute ", name));
  SO_H5(H5Awrite(attr.get(), type.get(), value.data()), "writing attribute ", name);
}

void write_int_attr(hid_t obj, const char* name, int64_t value) {
  H5Id space = check_id(H5Screate(H5S_SCALAR), "H5Screate");
  H5Id attr = check_id(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                       str_cat("creating attribute ", name));
  SO_H5(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), "writing attribute ", name);
}

}  // namespace

std::vector<Segment> cut_segments(std::vector<Segment> slices, int64_t numel) {
  std::sort(slices.begin(), slices.end(), [](const Segment& a, const Segment& b) { return a.first < b.first; });
  std::vector<Segment> out;
  int64_t at = 0;
  for (const Segment& s : slices) {
    if (s.count == 0) continue;
    SO_CHECK(s.first == at, "checkpoint: the ranks' slices leave a gap or overlap at element ", at);
    for (int64_t e = s.first; e < s.first + s.count;) {
      const int64_t end = std::min(s.first + s.count, (e / kChunkElements + 1) * kChunkElements);
      out.push_back(Segment{e, end - e});
      e = end;
    }
    at = s.first + s.count;
  }
  SO_CHECK(at == numel, "checkpoint: the ranks' slices cover ", at, " of ", numel, " elements");
  return out;
}

std::string data_name(const TensorGroup& g, const std::string& param) { return str_cat(g.path, "/", param); }
std::string checksum_name(const TensorGroup& g, const std::string& param) {
  return str_cat("/checksums", g.path, "/", param);
}

nlohmann::json manifest_of(const ParamLayout& layout) {
  nlohmann::json m = nlohmann::json::array();
  for (const ParamInfo& p : layout.params)
    m.push_back({{"name", p.name}, {"shape", p.shape}, {"dtype", "float32"}, {"numel", p.numel}});
  return m;
}

nlohmann::json make_metadata(const TrainState& state, int world_size, int zero_stage, const nlohmann::json& config,
                             const nlohmann::json& model_config, const ParamLayout& layout) {
  return {{"format", kFormat},
          {"format_version", kCheckpointFormatVersion},
          {"state",
           {{"iteration", state.iteration},
            {"steps_taken", state.steps_taken},
            {"data_position", state.data_position},
            {"last_step_redone", state.last_step_redone}}},
          {"world_size", world_size},
          {"zero_stage", zero_stage},
          {"checksum", {{"algorithm", "crc32c"}, {"chunk_elements", kChunkElements}}},
          {"config", config},
          {"model_config", model_config},
          {"manifest", manifest_of(layout)}};
}

void check_room(const std::string& dir, uint64_t bytes) {
  const auto mb = [](uint64_t b) { return str_cat(b / 1e6, " MB"); };
  struct statvfs fsinfo {};
  SO_CHECK(::statvfs(dir.c_str(), &fsinfo) == 0, "cannot query the free space of '", dir, "': ", std::strerror(errno));
  const uint64_t avail = static_cast<uint64_t>(fsinfo.f_bavail) * fsinfo.f_frsize;
  SO_CHECK(bytes <= avail, "the checkpoint needs about ", mb(bytes), " but the filesystem holding '", dir, "' has ",
           mb(avail), " free");
  struct rlimit limit {};
  SO_CHECK(::getrlimit(RLIMIT_FSIZE, &limit) == 0, "getrlimit(RLIMIT_FSIZE): ", std::strerror(errno));
  SO_CHECK(limit.rlim_cur == RLIM_INFINITY || bytes <= limit.rlim_cur, "the checkpoint needs about ", mb(bytes),
           " but this process may not write files larger than ", mb(limit.rlim_cur), " (ulimit -f)");
}

void create_file(const std::string& path, const nlohmann::json& metadata, const ParamLayout& layout,
                 const std::vector<int64_t>& segments_per_tensor, const std::vector<int>& write_order) {
  std::vector<int> sorted(write_order);
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i)
    SO_CHECK(sorted[i] == static_cast<int>(i), "checkpoint: the write order is not each tensor once");
  SO_CHECK(sorted.size() == layout.params.size() && segments_per_tensor.size() == layout.params.size(),
           "checkpoint: ", sorted.size(), " tensors in the write order and ", segments_per_tensor.size(),
           " segment counts for ", layout.params.size(), " tensors");
  // The datasets, their checksum tables and the metadata, plus HDF5's own structures (under 1 KiB
  // per dataset measured; 4 KiB counted) and its superblock and root group.
  uint64_t bytes = metadata.dump().size() + (uint64_t{1} << 20);
  for (size_t id = 0; id < layout.params.size(); ++id)
    bytes += std::size(kGroups) * (4 * static_cast<uint64_t>(layout.params[id].numel) +
                                   24 * static_cast<uint64_t>(segments_per_tensor[id]) + 2 * 4096);
  check_room(fs::path(path).parent_path().string(), bytes);
  // Datasets of a block or more start on a block boundary, so a rank's slice of one is written
  // and read in whole blocks around the page cache (DirectIoFile).
  H5Id fapl = check_id(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate(file access)");
  SO_H5(H5Pset_alignment(fapl.get(), DirectIoFile::kBlock, DirectIoFile::kBlock), "alignment");
  H5Id file = check_id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()),
                       str_cat("creating checkpoint '", path, "'"));
  const hid_t f = file.get();
  write_string_attr(f, "format", kFormat);
  write_int_attr(f, "format_version", kCheckpointFormatVersion);
  {
    const std::string text = metadata.dump();
    H5Id type = check_id(H5Tcopy(H5T_C_S1), "H5Tcopy");
    SO_H5(H5Tset_size(type.get(), std::max<size_t>(1, text.size())), "metadata type");
    H5Id space = check_id(H5Screate(H5S_SCALAR), "H5Screate");
    H5Id ds = check_id(H5Dcreate2(f, kMetadata, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                       "creating /metadata");
    SO_H5(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()), "writing /metadata");
    const uint32_t crc = crc32c(text.data(), text.size());
    H5Id aspace = check_id(H5Screate(H5S_SCALAR), "H5Screate");
    H5Id attr = check_id(H5Acreate2(ds.get(), "crc32c", H5T_STD_U32LE, aspace.get(), H5P_DEFAULT, H5P_DEFAULT),
                         "creating /metadata crc32c");
    SO_H5(H5Awrite(attr.get(), H5T_NATIVE_UINT32, &crc), "writing /metadata crc32c");
  }
  H5Id lcpl = check_id(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate(link)");
  SO_H5(H5Pset_create_intermediate_group(lcpl.get(), 1), "intermediate groups");
  // Storage allocated now, nothing filled: every byte is written once, by the rank that owns it.
  H5Id dcpl = check_id(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate(dataset)");
  SO_H5(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), "early allocation");
  SO_H5(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "no fill");
  auto create = [&](const std::string& name, hid_t type, const std::vector<hsize_t>& dims) {
    H5Id space = check_id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "dataspace");
    H5Id ds = check_id(H5Dcreate2(f, name.c_str(), type, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
                       str_cat("creating dataset ", name));
  };
  for (const TensorGroup& g : kGroups)
    for (size_t id = 0; id < layout.params.size(); ++id)
      create(checksum_name(g, layout.params[id].name), H5T_STD_U64LE,
             {static_cast<hsize_t>(segments_per_tensor[id]), 3});
  for (const int id : write_order)
    for (const TensorGroup& g : kGroups) {
      const ParamInfo& p = layout.params[static_cast<size_t>(id)];
      create(data_name(g, p.name), H5T_IEEE_F32LE, std::vector<hsize_t>(p.shape.begin(), p.shape.end()));
    }
  SO_H5(H5Fflush(f, H5F_SCOPE_GLOBAL), "flushing '", path, "'");
}

std::map<std::string, uint64_t> dataset_offsets(const std::string& path, const std::vector<std::string>& datasets) {
  H5Id file = check_id(quietly([&] { return H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT); }),
                       str_cat("opening '", path, "'"));
  std::map<std::string, uint64_t> out;
  for (const std::string& name : datasets) {
    H5Id ds = check_id(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT), str_cat("opening ", name));
    const haddr_t at = H5Dget_offset(ds.get());
    SO_CHECK(at != HADDR_UNDEF, "checkpoint '", path, "': dataset ", name, " has no storage");
    out[name] = at;
  }
  return out;
}

// ---- reading -------------------------------------------------------------------------------

void parse_metadata(std::string_view text, const std::string& where, CheckpointSummary& summary, ParamLayout& layout) {
  const std::string msource = str_cat(where, ": metadata");
  const nlohmann::json doc = parse_json_text(text, msource);
  JsonReader r(doc, msource);
  SO_CHECK(r.require<std::string>("format") == kFormat, where, " is not a so_train checkpoint");
  // Every field is required: a document missing one was not written by this format's writer.
  summary.format_version = r.require_in("format_version", kCheckpointFormatVersion, kCheckpointFormatVersion);
  {
    JsonReader s = r.child("state");
    summary.state.iteration = s.require_in("iteration", 0, kMaxSteps);
    summary.state.steps_taken = s.require_in("steps_taken", 0, summary.state.iteration);
    summary.state.data_position = s.require_in("data_position", 0, int64_t{1} << 62);
    summary.state.last_step_redone = s.require<bool>("last_step_redone");
    s.finish();
  }
  summary.world_size = r.require_in("world_size", 1, 1 << 24);
  summary.zero_stage = r.require_in("zero_stage", 0, 3);
  {
    JsonReader c = r.child("checksum");
    if (c.require<std::string>("algorithm") != "crc32c") c.fail("algorithm", "is not crc32c");
    c.require_in("chunk_elements", kChunkElements, kChunkElements);
    c.finish();
  }
  for (const char* k : {"config", "model_config", "manifest"})
    if (!r.has(k)) r.fail(k, "is missing");
  summary.config = r.raw().at("config");
  r.accept("config");
  if (!summary.config.is_object()) r.fail("config", "must be an object");
  summary.model_config = r.raw().at("model_config");
  r.accept("model_config");
  summary.manifest = r.raw().at("manifest");
  r.accept("manifest");
  r.finish();
  // The manifest must be exactly the tensors of the model the checkpoint says it holds.
  layout = ParamLayout::for_model(ModelConfig::from_hf_json(summary.model_config, msource + " model_config"));
  SO_CHECK(summary.manifest == manifest_of(layout), where,
           ": the manifest does not list the tensors of its model_config");
}

CheckpointFile::CheckpointFile(const std::string& path) : path_(path) {
  const std::string where = str_cat("checkpoint '", path, "'");
  const H5File h5 = H5File::open_read(path);
  // HDF5's view of where the file ends: a dataset beyond it is one h5py cannot read, whatever
  // bytes lie there (a damaged superblock moves the end of allocation).
  const uint64_t file_end = std::min(h5.size(), h5.end_of_allocation());

  // The metadata document, checked against its CRC32C before a field of it is read.
  SO_CHECK(h5.exists(kMetadata), where, " has no ", kMetadata, " (not a so_train checkpoint of format ",
           kCheckpointFormatVersion, ")");
  const std::string text = h5.read_string(kMetadata, kMaxMetadataBytes);
  const int64_t want_crc = h5.read_int_attr(kMetadata, "crc32c");
  SO_CHECK(crc32c(text.data(), text.size()) == want_crc, where, ": ", kMetadata,
           " fails its checksum (the checkpoint is damaged)");
  parse_metadata(text, where, summary_, layout_);
  summary_.path = path;
  // The root copies are what an h5py user reads first: they must say what /metadata says.
  const std::string root_format = h5.read_string_attr("/", "format");
  const int64_t root_version = h5.read_int_attr("/", "format_version");
  SO_CHECK(root_format == kFormat && root_version == summary_.format_version, where, ": the root attributes say '",
           root_format, "' version ", root_version, " but ", kMetadata, " says '", kFormat, "' version ",
           summary_.format_version);

  for (const TensorGroup& g : kGroups)
    for (const ParamInfo& p : layout_.params) {
      Tensor t;
      t.numel = p.numel;
      const std::string dname = data_name(g, p.name), cname = checksum_name(g, p.name);
      uint64_t table_offset = 0;
      int64_t n_segments = 0;
      for (const bool table : {false, true}) {
        const std::string& name = table ? cname : dname;
        SO_CHECK(h5.exists(name), where, " has no dataset ", name);
        const H5File::Contiguous c = h5.contiguous(name, table ? H5T_STD_U64LE : H5T_IEEE_F32LE,
                                                   table ? "uint64 little-endian" : "float32 little-endian");
        const std::vector<int64_t>& dims = c.shape;
        if (table) {
          SO_CHECK(dims.size() == 2 && dims[1] == 3 && dims[0] >= 1 && dims[0] <= p.numel, where, ": checksum table ",
                   name, " has the wrong shape");
          n_segments = dims[0];
        } else {
          SO_CHECK(dims == p.shape, where, ": dataset ", name, " has the wrong shape");
        }
        const uint64_t at = c.offset;
        const uint64_t bytes = table ? static_cast<uint64_t>(n_segments) * 24 : static_cast<uint64_t>(p.numel) * 4;
        SO_CHECK(c.offset != HADDR_UNDEF, where, ": dataset ", name, " has no storage (never written)");
        SO_CHECK(at <= file_end && bytes <= file_end - at, where, ": dataset ", name, " (bytes ", at, " to ",
                 at + bytes, ") lies outside the file's ", file_end,
                 " bytes (truncated, damaged superblock, or never written)");
        // Read by pieces in place (read_to), a dataset of a block or more must start on a whole
        // value; so_train aligns them to the block (create_file).
        SO_CHECK(bytes < DirectIoFile::kBlock || at % 8 == 0, where, ": dataset ", name, " starts at byte ", at,
                 ", not on a whole value (not written by so_train)");
        (table ? table_offset : t.data_offset) = at;
      }
      // The table, read now (it is small) and checked to tile the tensor in chunk-bounded pieces.
      if (!file_) file_ = std::make_unique<DirectIoFile>(path, DirectIoFile::Mode::Read);
      std::vector<uint64_t> raw(static_cast<size_t>(n_segments) * 3);
      file_->read_at(raw.data(), raw.size() * 8, table_offset, str_cat(where, ": checksum table ", cname));
      int64_t at = 0;
      for (int64_t i = 0; i < n_segments; ++i) {
        const uint64_t first = raw[3 * i], count = raw[3 * i + 1], crc = raw[3 * i + 2];
        const bool ok = first == static_cast<uint64_t>(at) && count >= 1 &&
                        count <= static_cast<uint64_t>(kChunkElements) &&
                        first / kChunkElements == (first + count - 1) / kChunkElements && crc <= UINT32_MAX &&
                        first + count <= static_cast<uint64_t>(p.numel);
        SO_CHECK(ok, where, ": checksum table ", cname, " entry ", i,
                 " is not a valid segment (damaged, or never written)");
        t.segments.push_back(Segment{static_cast<int64_t>(first), static_cast<int64_t>(count)});
        t.crcs.push_back(static_cast<uint32_t>(crc));
        at = static_cast<int64_t>(first + count);
      }
      SO_CHECK(at == p.numel, where, ": checksum table ", cname, " covers ", at, " of ", p.numel, " elements");
      tensors_.emplace(dname, std::move(t));
    }
}

CheckpointFile::~CheckpointFile() = default;

const CheckpointFile::Tensor& CheckpointFile::tensor(const std::string& dataset) const {
  const auto it = tensors_.find(dataset);
  SO_CHECK(it != tensors_.end(), "checkpoint '", path_, "' has no dataset ", dataset);
  return it->second;
}

// Whole segments only: a checksum covers its segment, so a read starts and ends on their edges.
CheckpointFile::SegmentSpan CheckpointFile::segments_of(const Tensor& t, int64_t first, int64_t count) {
  const auto begin = t.segments.begin(), end = t.segments.end();
  SegmentSpan s;
  s.seg = std::partition_point(begin, end, [&](const Segment& g) { return g.first + g.count <= first; }) - begin;
  const size_t last =
      std::partition_point(begin, end, [&](const Segment& g) { return g.first < first + count; }) - begin;
  s.lo = t.segments[s.seg].first;
  s.hi = t.segments[last - 1].first + t.segments[last - 1].count;
  return s;
}

const CheckpointFile::Tensor& CheckpointFile::checked_slice(const std::string& dataset, int64_t first,
                                                            int64_t count) const {
  const Tensor& t = tensor(dataset);
  SO_CHECK(first >= 0 && count >= 0 && first + count <= t.numel, "checkpoint: elements [", first, ", ", first + count,
           ") of ", dataset, " (", t.numel, " elements)");
  return t;
}

std::vector<size_t> CheckpointFile::plan_reads(const std::vector<Slice>& slices) const {
  std::vector<std::pair<uint64_t, size_t>> at;  // where each slice's first segment starts
  std::vector<DirectIoFile::Range> ranges(slices.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    const Slice& sl = slices[i];
    const Tensor& t = checked_slice(sl.dataset, sl.first, sl.count);
    if (sl.count > 0) {
      const SegmentSpan span = segments_of(t, sl.first, sl.count);
      ranges[i] = {t.data_offset + static_cast<uint64_t>(span.lo) * 4, static_cast<size_t>(span.hi - span.lo) * 4};
    }
    at.push_back({ranges[i].offset, i});
  }
  std::sort(at.begin(), at.end());
  std::vector<size_t> order;
  std::vector<DirectIoFile::Range> planned;
  for (const auto& [offset, i] : at) {
    order.push_back(i);
    if (ranges[i].bytes > 0) planned.push_back(ranges[i]);
  }
  file_->will_read(planned);
  return order;
}

void CheckpointFile::read_to(const std::string& dataset, int64_t first, int64_t count, const Deliver& deliver) const {
  const Tensor& t = checked_slice(dataset, first, count);
  if (count == 0) return;
  const SegmentSpan span = segments_of(t, first, count);
  size_t seg = span.seg;
  const int64_t lo = span.lo, hi = span.hi;
  uint32_t crc = 0;
  const std::string what = str_cat("checkpoint '", path_, "': dataset ", dataset);
  file_->read_to(
      static_cast<size_t>(hi - lo) * 4, t.data_offset + static_cast<uint64_t>(lo) * 4,
      [&](const char* src, size_t from, size_t n) {
        // Pieces split where the file's 4 MiB pieces do: on whole values, since datasets
        // read by pieces start on a multiple of 4 (checked at open).
        SO_CHECK(from % 4 == 0 && n % 4 == 0, what, ": a read split a value");
        const auto* v = reinterpret_cast<const float*>(src);
        for (int64_t e = lo + static_cast<int64_t>(from / 4), stop = e + static_cast<int64_t>(n / 4); e < stop;) {
          const Segment& s = t.segments[seg];
          const int64_t k = std::min(stop, s.first + s.count) - e;  // values of this segment here
          crc = crc32c(v, static_cast<size_t>(k) * 4, crc);
          const int64_t a = std::max(e, first), b = std::min(e + k, first + count);
          if (a < b) deliver(v + (a - e), a, b - a);
          v += k, e += k;
          if (e == s.first + s.count) {
            SO_CHECK(crc == t.crcs[seg], what, " elements [", s.first, ", ", s.first + s.count,
                     ") fail their checksum (the checkpoint is damaged)");
            ++seg, crc = 0;
          }
        }
      },
      what);
}

void CheckpointFile::read_into(const std::string& dataset, int64_t first, int64_t count, float* out) const {
  read_to(dataset, first, count, [&](const float* v, int64_t e, int64_t n) { std::copy_n(v, n, out + (e - first)); });
}

std::vector<float> CheckpointFile::read(const std::string& dataset, int64_t first, int64_t count) const {
  std::vector<float> out(static_cast<size_t>(std::max<int64_t>(count, 0)));
  read_into(dataset, first, count, out.data());
  return out;
}

std::vector<std::string> CheckpointFile::verify_all() const {
  std::vector<std::string> problems;
  std::vector<Slice> all;
  for (const auto& [name, t] : tensors_) all.push_back({name, 0, t.numel});
  for (const size_t i : plan_reads(all)) {
    try {
      read_to(all[i].dataset, 0, all[i].count, [](const float*, int64_t, int64_t) {});
    } catch (const Error& e) {
      problems.push_back(e.what());  // one line per damaged tensor
    }
  }
  return problems;
}

}  // namespace so::ckpt
