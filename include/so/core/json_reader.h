#pragma once
// Reads a JSON object key by key, with the full key path in every error, and rejects keys that
// nobody read (finish()). Used for run configs and HF model configs alike. Every JSON document
// so_train reads (configs, HF config.json, safetensors headers, checkpoint attributes) goes through
// parse_json_text: bounded nesting and no duplicate keys, so no reader can be crashed by a crafted
// file (recursive dumps and copies of a 100,000-level document) or fed a value silently dropped.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace so {

class JsonReader {
 public:
  // `source` names the document (a file path); `path` is the dotted key path of this object.
  JsonReader(const nlohmann::json& obj, std::string source, std::string path = "");

  bool has(const std::string& key) const;
  template <typename T>
  T get(const std::string& key, const T& fallback);
  template <typename T>
  T require(const std::string& key);
  // An integer in [lo, hi] (fallback when absent): never narrowed silently.
  int64_t get_in(const std::string& key, int64_t fallback, int64_t lo, int64_t hi);
  // The same for a key that must be present (a missing one fails, naming it).
  int64_t require_in(const std::string& key, int64_t lo, int64_t hi);
  JsonReader child(const std::string& key);  // the key must hold an object
  // Marks a key as accepted without reading it (a documented no-op setting).
  void accept(const std::string& key);
  // Fails on the first key that was present but never read.
  void finish() const;
  [[noreturn]] void fail(const std::string& key, const std::string& msg) const;
  std::string key_path(const std::string& key) const;
  const nlohmann::json& raw() const { return obj_; }

 private:
  template <typename T>
  T convert(const std::string& key, const nlohmann::json& v) const;

  const nlohmann::json& obj_;
  std::string source_;
  std::string path_;
  std::set<std::string> used_;
};

// The deepest nesting accepted (a run config needs 4 levels, a checkpoint's attributes 5).
constexpr int kMaxJsonDepth = 64;

// Parses JSON text; errors name `source`: not JSON, nested deeper than kMaxJsonDepth, or a key
// given twice in one object (JSON parsers disagree on which one wins; DeepSpeed refuses it too).
nlohmann::json parse_json_text(std::string_view text, const std::string& source);
// Parses the JSON file at `path`; errors name it as `what` (e.g. "model config") and the path.
// Only regular files up to max_bytes are read (a FIFO or device is refused, never blocked on).
nlohmann::json read_json_file(const std::string& path, const std::string& what, int64_t max_bytes = 64 << 20);

// A value for an error message: numbers and short strings whole, long strings cut at 64
// characters, arrays and objects by their size (never a dump of a crafted 256 MB value).
std::string brief_json(const nlohmann::json& v);

}  // namespace so
