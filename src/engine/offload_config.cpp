#include "so/engine/offload_config.h"

namespace so {

const char* offload_mode_name(OffloadMode m) {
  switch (m) {
    case OffloadMode::None: return "on-device optimizer";
    case OffloadMode::ZeroOffload: return "ZeRO-Offload";
    case OffloadMode::SuperOffload: return "SuperOffload";
  }
  return "?";
}

const char* cast_site_name(CastSite c) {
  switch (c) {
    case CastSite::Auto: return "auto";
    case CastSite::Device: return "device";
    case CastSite::Host: return "host";
  }
  return "?";
}

const char* rollback_mode_name(RollbackMode r) { return r == RollbackMode::Exact ? "exact" : "inverse"; }

}  // namespace so
