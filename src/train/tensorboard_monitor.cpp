#include "so/train/tensorboard_monitor.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "so/core/error.h"
#include "so/core/log.h"
#include "so/io/crc32c.h"
#include "train/tensorboard_event.pb.h"

namespace so {

namespace {

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string little_endian(uint64_t v, int bytes) {
  std::string s(static_cast<size_t>(bytes), '\0');
  for (int i = 0; i < bytes; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// TFRecord framing of one record: length (u64 little-endian), its masked CRC32C, the payload, the
// payload's masked CRC32C (tensorflow/core/lib/io/record_writer.cc).
std::string tfrecord_frame(const std::string& payload) {
  const std::string length = little_endian(payload.size(), 8);
  return length + little_endian(masked_crc32c(length.data(), length.size()), 4) + payload +
         little_endian(masked_crc32c(payload.data(), payload.size()), 4);
}

}  // namespace

TensorBoardMonitor::TensorBoardMonitor(const MonitorConfig& cfg, bool writer, const std::string& config_text) {
  if (!cfg.enabled || !writer) return;
  const std::filesystem::path dir = make_monitor_directory(cfg, "tensorboard");
  // SummaryWriter's name: TensorBoard reads every file whose name holds "tfevents".
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  path_ = (dir / str_cat("events.out.tfevents.", static_cast<int64_t>(wall_time()), ".", host, ".", getpid(), ".0"))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  SO_CHECK(file_, "tensorboard: cannot create the event file '", path_, "': ", std::strerror(errno));

  tensorboard::Event version;
  version.set_wall_time(wall_time());
  version.set_file_version("brain.Event:2");
  bool written = append(version.SerializeAsString());
  // The config as the text plugin shows it: a scalar string tensor tagged with the plugin's name.
  tensorboard::Event text;
  text.set_wall_time(wall_time());
  text.set_step(0);
  tensorboard::Summary::Value* v = text.mutable_summary()->add_value();
  v->set_tag("config/text_summary");
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  tensorboard::TensorProto* t = v->mutable_tensor();
  t->set_dtype(tensorboard::DT_STRING);
  t->mutable_tensor_shape();
  t->add_string_val(config_text);
  written = written && append(text.SerializeAsString());
  SO_CHECK(written, "tensorboard: writing the event file '", path_, "' failed: ", std::strerror(errno));
}

TensorBoardMonitor::~TensorBoardMonitor() {
  if (file_) std::fclose(file_);
}

void TensorBoardMonitor::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  if (!on()) return;
  tensorboard::Event e;
  e.set_wall_time(wall_time());
  e.set_step(step);
  for (const auto& [tag, value] : values) {
    tensorboard::Summary::Value* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  // A failed write (a full disk) is reported once; the monitor then stops and training goes on.
  if (append(e.SerializeAsString())) return;
  log_warn(str_cat("tensorboard: writing '", path_, "' failed (", std::strerror(errno),
                   "); no more TensorBoard events are written, training goes on"));
  std::fclose(file_);
  file_ = nullptr;
}

// Each record reaches the file before the next step: a run that dies keeps what it logged.
bool TensorBoardMonitor::append(const std::string& payload) {
  const std::string record = tfrecord_frame(payload);
  return std::fwrite(record.data(), 1, record.size(), file_) == record.size() && std::fflush(file_) == 0;
}

}  // namespace so
