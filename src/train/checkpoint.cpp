#include "so/train/checkpoint.h"


#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "parallel/mpi_comm.h"
#include "so/core/error.h"
#include "so/io/atomic_file.h"
#include "so/io/hdf5_file.h"

namespace so {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "so_train checkpoint";
constexpr const char* kLatest = "latest";
constexpr int64_t kChunkElems = int64_t{1} << 20;  // 4 MiB fp32 chunks: checksum granularity

struct TensorGroup {
  OptimState which;
  const char* group;
};
constexpr TensorGroup kGroups[] = {
    {OptimState::Master, "/model"}, {OptimState::ExpAvg, "/optim/exp_avg"}, {OptimState::ExpAvgSq, "/optim/exp_avg_sq"}};

#define SO_H5(call, ...) SO_CHECK((call) >= 0, "HDF5: ", #call, " failed: ", __VA_ARGS__)

H5Id check_id(hid_t id, const std::string& what) {
  SO_CHECK(id >= 0, "HDF5: ", what, " failed");
  return H5Id(id);
}

H5Id mpio_access(Communicator& comm) {
  H5Id fapl = check_id(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate(file access)");
  SO_H5(H5Pset_fapl_mpio(fapl.get(), mpi_comm_of(comm), MPI_INFO_NULL), "MPI-IO file access");
  return fapl;
}

H5Id collective_transfer() {
  H5Id dxpl = check_id(H5Pcreate(H5P_DATASET_XFER), "H5Pcreate(transfer)");
  // Filtered (checksummed) datasets can only be written collectively in parallel HDF5.
  SO_H5(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE), "collective transfer");
  return dxpl;
}

// Flattened elements [first, first + count) of a row-major 1-D or 2-D tensor as three
// rectangles — the tail of a first row, whole rows, the head of a last row — any of them empty.
// Always three, so every rank makes the same number of collective calls per dataset.
struct Rect {
  hsize_t start[2] = {0, 0}, count[2] = {0, 0};
  int64_t offset = 0;  // into the rank's contiguous buffer
  int64_t size() const { return static_cast<int64_t>(count[0] * count[1]); }
};
std::array<Rect, 3> split_range(const std::vector<int64_t>& shape, int64_t first, int64_t count) {
  SO_CHECK(shape.size() == 1 || shape.size() == 2, "checkpoint: tensors of rank ", shape.size(), " are not supported");
  const int64_t C = shape.back(), end = first + count;
  std::array<Rect, 3> r;
  auto set = [&](Rect& x, int64_t row, int64_t col, int64_t rows, int64_t cols, int64_t offset) {
    if (rows <= 0 || cols <= 0) return;
    x.start[0] = static_cast<hsize_t>(row), x.start[1] = static_cast<hsize_t>(col);
    x.count[0] = static_cast<hsize_t>(rows), x.count[1] = static_cast<hsize_t>(cols);
    x.offset = offset;
  };
  if (count == 0) return r;
  int64_t r0 = first / C, c0 = first % C;
  const int64_t r1 = end / C, c1 = end % C;
  if (r0 == r1) {
    set(r[0], r0, c0, 1, c1 - c0, 0);
    return r;
  }
  int64_t at = 0;
  if (c0 > 0) set(r[0], r0, c0, 1, C - c0, 0), at = C - c0, ++r0;
  set(r[1], r0, 0, r1 - r0, C, at);
  set(r[2], r1, 0, 1, c1, at + (r1 - r0) * C);
  return r;
}

// File and memory dataspaces of one rectangle (a 1-D tensor is one row of a 2-D view).
std::pair<H5Id, H5Id> rect_spaces(hid_t dataset, const std::vector<int64_t>& shape, const Rect& x) {
  H5Id file = check_id(H5Dget_space(dataset), "H5Dget_space");
  const bool one_d = shape.size() == 1;
  const hsize_t mem_dims[2] = {std::max<hsize_t>(x.count[0], 1), std::max<hsize_t>(x.count[1], 1)};
  H5Id mem = check_id(H5Screate_simple(one_d ? 1 : 2, one_d ? mem_dims + 1 : mem_dims, nullptr), "memory dataspace");
  if (x.size() == 0) {
    SO_H5(H5Sselect_none(file.get()), "empty selection");
    SO_H5(H5Sselect_none(mem.get()), "empty selection");
  } else {
    SO_H5(H5Sselect_hyperslab(file.get(), H5S_SELECT_SET, one_d ? x.start + 1 : x.start, nullptr,
                              one_d ? x.count + 1 : x.count, nullptr),
          "hyperslab");
  }
  return {std::move(file), std::move(mem)};
}

std::vector<hsize_t> dims_of(const std::vector<int64_t>& shape) { return {shape.begin(), shape.end()}; }

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

int64_t read_int_attr(hid_t obj, const char* name, const std::string& path) {
  SO_CHECK(H5Aexists(obj, name) > 0, "checkpoint '", path, "' has no attribute '", name, "'");
  H5Id attr = check_id(H5Aopen(obj, name, H5P_DEFAULT), str_cat("opening attribute ", name));
  int64_t v = 0;
  SO_H5(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), "reading attribute ", name, " of ", path);
  return v;
}

std::string read_string_attr(hid_t obj, const char* name, const std::string& path) {
  SO_CHECK(H5Aexists(obj, name) > 0, "checkpoint '", path, "' has no attribute '", name, "'");
  H5Id attr = check_id(H5Aopen(obj, name, H5P_DEFAULT), str_cat("opening attribute ", name));
  H5Id type = check_id(H5Aget_type(attr.get()), "H5Aget_type");
  std::string v(H5Tget_size(type.get()), '\0');
  SO_H5(H5Aread(attr.get(), type.get(), v.data()), "reading attribute ", name, " of ", path);
  while (!v.empty() && v.back() == '\0') v.pop_back();
  return v;
}

std::string step_file_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld.h5", static_cast<long long>(step));
  return buf;
}

nlohmann::json manifest(const ParamLayout& layout) {
  nlohmann::json m = nlohmann::json::array();
  for (const ParamInfo& p : layout.params)
    m.push_back({{"name", p.name}, {"shape", p.shape}, {"dtype", "float32"}, {"numel", p.numel}});
  return m;
}

}  // namespace

std::string save_checkpoint(Engine& engine, Communicator& comm, const RunConfig& cfg, const TrainState& state,
                            const std::string& dir, int keep) {
  SO_CHECK(keep >= 1, "checkpoint: keep must be at least 1, is ", keep);
  const fs::path folder(dir), final_path = folder / step_file_name(state.steps_taken);
  const fs::path partial = folder / str_cat(".", step_file_name(state.steps_taken), ".partial");
  if (comm.rank() == 0) {
    std::error_code ec;
    fs::create_directories(folder, ec);
    SO_CHECK(!ec, "cannot create checkpoint directory '", dir, "': ", ec.message());
  }
  comm.barrier();
  const ParamLayout& layout = engine.layout();
  {
    H5Id fapl = mpio_access(comm);
    H5Id file = check_id(H5Fcreate(partial.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()),
                         str_cat("creating checkpoint '", partial.string(), "'"));
    const hid_t f = file.get();
    write_string_attr(f, "format", kFormat);
    write_int_attr(f, "format_version", kCheckpointFormatVersion);
    write_int_attr(f, "iteration", state.iteration);
    write_int_attr(f, "steps_taken", state.steps_taken);
    write_int_attr(f, "data_position", state.data_position);
    write_int_attr(f, "last_step_redone", state.last_step_redone ? 1 : 0);
    write_int_attr(f, "world_size", comm.size());
    write_string_attr(f, "config", cfg.resolved.dump());
    write_string_attr(f, "model_config", cfg.model.to_hf_json().dump());
    write_string_attr(f, "manifest", manifest(layout).dump());
    H5Id lcpl = check_id(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate(link)");
    SO_H5(H5Pset_create_intermediate_group(lcpl.get(), 1), "intermediate groups");
    H5Id dxpl = collective_transfer();
    for (const TensorGroup& g : kGroups)
      for (size_t id = 0; id < layout.params.size(); ++id) {
        const ParamInfo& p = layout.params[id];
        const std::string name = str_cat(g.group, "/", p.name);
        const std::vector<hsize_t> dims = dims_of(p.shape);
        std::vector<hsize_t> chunk = dims;
        chunk.back() = std::min<hsize_t>(chunk.back(), kChunkElems);
        if (chunk.size() == 2) chunk[0] = std::clamp<hsize_t>(kChunkElems / chunk[1], 1, dims[0]);
        H5Id dcpl = check_id(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate(dataset)");
        SO_H5(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), "chunking ", name);
        SO_H5(H5Pset_fletcher32(dcpl.get()), "Fletcher32 on ", name);
        // Every element is written: skip the fill values parallel HDF5 would write at creation.
        SO_H5(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "fill time of ", name);
        H5Id fspace = check_id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "dataspace");
        H5Id ds = check_id(H5Dcreate2(f, name.c_str(), H5T_IEEE_F32LE, fspace.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
                           str_cat("creating dataset ", name));
        const ParamSlice mine = engine.owned_slice(static_cast<int>(id));
        const std::vector<float> values = engine.read_owned(static_cast<int>(id), g.which);
        for (const Rect& x : split_range(p.shape, mine.first, mine.count)) {
          auto [fs_, ms] = rect_spaces(ds.get(), p.shape, x);
          SO_H5(H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, ms.get(), fs_.get(), dxpl.get(), values.data() + x.offset),
                "writing ", name, " to ", partial.string());
        }
      }
  }  // closing the file flushes it on every rank
  comm.barrier();
  // Crash-safety tests kill the job here: everything written, nothing committed yet.
  if (const char* pause = std::getenv("SO_CKPT_TEST_PAUSE_BEFORE_COMMIT"); pause && comm.rank() == 0) {
    std::fprintf(stderr, "checkpoint: paused before committing %s\n", final_path.c_str());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(pause)));
  }
  if (comm.rank() == 0) {
    publish_file(partial.string(), final_path.string());
    write_file_atomically((folder / kLatest).string(), final_path.filename().string() + "\n");
    // Keep the newest `keep` checkpoints; never the one `latest` names.
    std::vector<fs::path> old;
    for (const auto& e : fs::directory_iterator(folder)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("step-", 0) == 0 && e.path().extension() == ".h5") old.push_back(e.path());
    }
    std::sort(old.begin(), old.end());
    for (size_t i = 0; i + static_cast<size_t>(keep) < old.size(); ++i)
      if (old[i] != final_path) fs::remove(old[i]);
  }
  comm.barrier();
  return final_path.string();
}

std::string resolve_checkpoint(const std::string& file_or_dir) {
  const fs::path p(file_or_dir);
  SO_CHECK(fs::exists(p), "checkpoint '", file_or_dir, "' does not exist");
  if (!fs::is_directory(p)) return file_or_dir;
  const fs::path latest = p / kLatest;
  SO_CHECK(fs::exists(latest), "checkpoint directory '", file_or_dir, "' has no '", kLatest, "' pointer");
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  SO_CHECK(!name.empty() && fs::exists(p / name), "'", latest.string(), "' names '", name, "', which does not exist");
  return (p / name).string();
}

TrainState load_checkpoint(Engine& engine, Communicator& comm, const RunConfig& cfg, const std::string& file_or_dir) {
  const std::string path = resolve_checkpoint(file_or_dir);
  H5Id fapl = mpio_access(comm);
  H5Id file;
  H5E_BEGIN_TRY { file = H5Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get())); }
  H5E_END_TRY;
  SO_CHECK(file.valid(), "cannot open checkpoint '", path, "' (not an HDF5 file, or truncated)");
  const hid_t f = file.get();
  SO_CHECK(read_string_attr(f, "format", path) == kFormat, "'", path, "' is not a so_train checkpoint");
  const int64_t version = read_int_attr(f, "format_version", path);
  SO_CHECK(version == kCheckpointFormatVersion, "checkpoint '", path, "' has format version ", version,
           "; this build reads version ", kCheckpointFormatVersion);
  const nlohmann::json saved_model = nlohmann::json::parse(read_string_attr(f, "model_config", path));
  SO_CHECK(saved_model == cfg.model.to_hf_json(), "checkpoint '", path, "' holds a different model: ",
           saved_model.dump(), " vs the config's ", cfg.model.to_hf_json().dump());
  const ParamLayout& layout = engine.layout();
  const nlohmann::json saved = nlohmann::json::parse(read_string_attr(f, "manifest", path));
  SO_CHECK(saved == manifest(layout), "checkpoint '", path, "': manifest differs from the model's tensors");

  H5Id dxpl = check_id(H5Pcreate(H5P_DATASET_XFER), "H5Pcreate(transfer)");
  for (const TensorGroup& g : kGroups)
    for (size_t id = 0; id < layout.params.size(); ++id) {
      const ParamInfo& p = layout.params[id];
      const std::string name = str_cat(g.group, "/", p.name);
      H5Id ds;
      H5E_BEGIN_TRY { ds = H5Id(H5Dopen2(f, name.c_str(), H5P_DEFAULT)); }
      H5E_END_TRY;
      SO_CHECK(ds.valid(), "checkpoint '", path, "' has no dataset ", name);
      H5Id fspace = check_id(H5Dget_space(ds.get()), "H5Dget_space");
      std::vector<hsize_t> dims(static_cast<size_t>(H5Sget_simple_extent_ndims(fspace.get())));
      H5Sget_simple_extent_dims(fspace.get(), dims.data(), nullptr);
      SO_CHECK(dims == dims_of(p.shape), "checkpoint '", path, "': dataset ", name, " has the wrong shape");
      const ParamSlice mine = engine.owned_slice(static_cast<int>(id));
      std::vector<float> values(static_cast<size_t>(mine.count));
      for (const Rect& x : split_range(p.shape, mine.first, mine.count)) {
        auto [fs_, ms] = rect_spaces(ds.get(), p.shape, x);
        herr_t rc;
        H5E_BEGIN_TRY { rc = H5Dread(ds.get(), H5T_NATIVE_FLOAT, ms.get(), fs_.get(), dxpl.get(), values.data() + x.offset); }
        H5E_END_TRY;
        SO_CHECK(rc >= 0, "checkpoint '", path, "': reading dataset ", name,
                 " failed (checksum mismatch or truncated file: the checkpoint is damaged)");
      }
      engine.write_owned(static_cast<int>(id), g.which, values);
    }
  TrainState s;
  s.iteration = read_int_attr(f, "iteration", path);
  s.steps_taken = read_int_attr(f, "steps_taken", path);
  s.data_position = read_int_attr(f, "data_position", path);
  s.last_step_redone = read_int_attr(f, "last_step_redone", path) != 0;
  engine.restore_counters(s.iteration, s.steps_taken, s.last_step_redone);
  return s;
}

namespace {

H5Id open_serial(const std::string& path) {
  H5Id file;
  H5E_BEGIN_TRY { file = H5Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)); }
  H5E_END_TRY;
  SO_CHECK(file.valid(), "cannot open checkpoint '", path, "' (not an HDF5 file, or truncated)");
  return file;
}

}  // namespace

CheckpointSummary read_checkpoint_summary(const std::string& file_or_dir) {
  CheckpointSummary c;
  c.path = resolve_checkpoint(file_or_dir);
  H5Id file = open_serial(c.path);
  const hid_t f = file.get();
  SO_CHECK(read_string_attr(f, "format", c.path) == kFormat, "'", c.path, "' is not a so_train checkpoint");
  c.format_version = read_int_attr(f, "format_version", c.path);
  c.world_size = read_int_attr(f, "world_size", c.path);
  c.state.iteration = read_int_attr(f, "iteration", c.path);
  c.state.steps_taken = read_int_attr(f, "steps_taken", c.path);
  c.state.data_position = read_int_attr(f, "data_position", c.path);
  c.state.last_step_redone = read_int_attr(f, "last_step_redone", c.path) != 0;
  c.config = nlohmann::json::parse(read_string_attr(f, "config", c.path));
  c.model_config = nlohmann::json::parse(read_string_attr(f, "model_config", c.path));
  c.manifest = nlohmann::json::parse(read_string_attr(f, "manifest", c.path));
  return c;
}

std::vector<float> read_checkpoint_tensor(const std::string& file, const std::string& dataset) {
  H5Id f = open_serial(file);
  H5Id ds;
  H5E_BEGIN_TRY { ds = H5Id(H5Dopen2(f.get(), dataset.c_str(), H5P_DEFAULT)); }
  H5E_END_TRY;
  SO_CHECK(ds.valid(), "checkpoint '", file, "' has no dataset ", dataset);
  H5Id space = check_id(H5Dget_space(ds.get()), "H5Dget_space");
  std::vector<float> out(static_cast<size_t>(H5Sget_simple_extent_npoints(space.get())));
  herr_t rc;
  H5E_BEGIN_TRY { rc = H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()); }
  H5E_END_TRY;
  SO_CHECK(rc >= 0, "checkpoint '", file, "': dataset ", dataset,
           " cannot be read (checksum mismatch or truncated file: the checkpoint is damaged)");
  return out;
}

std::vector<std::string> verify_checkpoint(const std::string& file_or_dir) {
  std::vector<std::string> problems;
  CheckpointSummary c;
  try {
    c = read_checkpoint_summary(file_or_dir);
  } catch (const Error& e) {
    return {e.what()};
  }
  if (c.format_version != kCheckpointFormatVersion)
    problems.push_back(str_cat("format version ", c.format_version, ", expected ", kCheckpointFormatVersion));
  for (const nlohmann::json& t : c.manifest) {
    const std::string name = t.at("name").get<std::string>();
    const int64_t numel = t.at("numel").get<int64_t>();
    for (const TensorGroup& g : kGroups) {
      const std::string ds = str_cat(g.group, "/", name);
      try {
        const std::vector<float> v = read_checkpoint_tensor(c.path, ds);
        if (static_cast<int64_t>(v.size()) != numel)
          problems.push_back(str_cat(ds, ": ", v.size(), " elements, the manifest says ", numel));
      } catch (const Error& e) {
        problems.push_back(e.what());
      }
    }
  }
  return problems;
}

}  // namespace so
