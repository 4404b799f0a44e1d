#pragma once
// Reads a JSON object key by key, with the full key path in every error, and rejects keys that
// nobody read (finish()). Used for run configs and HF model configs alike.
#include <nlohmann/json.hpp>
#include <set>
#include <string>
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

// Parses the JSON file at `path`; errors name it as `what` (e.g. "model config") and the path.
nlohmann::json read_json_file(const std::string& path, const std::string& what);

}  // namespace so
