// libFuzzer target: a JSON document as so_train reads a run config (DeepSpeed keys plus ours) and
// as the model layer reads a Hugging Face config.json. Every input must end in a so::Error (or be
// accepted); a crash, a sanitizer report or a hang is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "so/core/error.h"
#include "so/core/json_reader.h"
#include "so/model/model_config.h"
#include "so/train/run_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json doc;
  try {
    doc = so::parse_json_text(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz input");
  } catch (const so::Error&) {
    return 0;
  }
  try {
    so::parse_run_config(doc, "fuzz input");
  } catch (const so::Error&) {
  }
  try {
    so::ModelConfig::from_hf_json(doc, "fuzz input");
  } catch (const so::Error&) {
  }
  return 0;
}
