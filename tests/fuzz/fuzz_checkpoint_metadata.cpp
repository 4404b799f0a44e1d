// libFuzzer target: the /metadata document of a checkpoint (the JSON that passed its checksum):
// training state, format, model config and manifest, every field checked before use.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "so/core/error.h"
#include "src/train/checkpoint_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  so::CheckpointSummary summary;
  so::ParamLayout layout;
  try {
    so::ckpt::parse_metadata(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz input", summary, layout);
  } catch (const so::Error&) {
  }
  return 0;
}
