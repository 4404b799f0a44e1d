#include "so/backend/backend.h"

#include <memory>

namespace so {

void DeviceBuffer::reset() {
  if (ptr_ && owner_) owner_->free(ptr_, bytes_);
  owner_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

const char* stream_kind_name(StreamKind k) {
  switch (k) {
    case StreamKind::Compute: return "compute";
    case StreamKind::D2H: return "d2h";
    case StreamKind::H2D: return "h2d";
    case StreamKind::Comm: return "comm";
    case StreamKind::Snapshot: return "snapshot";
  }
  return "?";
}

void Backend::release_after(DeviceBuffer buf, Stream& s) {
  auto held = std::make_shared<DeviceBuffer>(std::move(buf));
  host_func(s, [held] { held->reset(); });
}

void Backend::copy_h2d_sync(void* dst, const void* src, size_t bytes, Stream& s) {
  copy_h2d(dst, src, bytes, s);
  synchronize(s);
}

void Backend::synchronize_all() {
  for (int k = 0; k < kNumStreamKinds; ++k) synchronize(stream(static_cast<StreamKind>(k)));
}

}  // namespace so
