#include "so/core/json_reader.h"

#include <cmath>
#include <fstream>

#include "so/core/error.h"

namespace so {

JsonReader::JsonReader(const nlohmann::json& obj, std::string source, std::string path)
    : obj_(obj), source_(std::move(source)), path_(std::move(path)) {
  if (!obj_.is_object()) {
    if (path_.empty()) throw Error(str_cat(source_, ": the document must be a JSON object"));
    throw Error(str_cat(source_, ": '", path_, "' must be an object, got ", obj_.type_name()));
  }
}

std::string JsonReader::key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

void JsonReader::fail(const std::string& key, const std::string& msg) const {
  throw Error(str_cat(source_, ": '", key_path(key), "' ", msg));
}

bool JsonReader::has(const std::string& key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }

void JsonReader::accept(const std::string& key) { used_.insert(key); }

template <>
bool JsonReader::convert<bool>(const std::string& key, const nlohmann::json& v) const {
  if (!v.is_boolean()) fail(key, str_cat("must be true or false, got ", v.type_name(), " ", v.dump()));
  return v.get<bool>();
}
template <>
double JsonReader::convert<double>(const std::string& key, const nlohmann::json& v) const {
  if (!v.is_number()) fail(key, str_cat("must be a number, got ", v.type_name(), " ", v.dump()));
  return v.get<double>();
}
template <>
float JsonReader::convert<float>(const std::string& key, const nlohmann::json& v) const {
  return static_cast<float>(convert<double>(key, v));
}
template <>
int64_t JsonReader::convert<int64_t>(const std::string& key, const nlohmann::json& v) const {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::floor(d) == d && std::abs(d) < 9e15) return static_cast<int64_t>(d);
  }
  fail(key, str_cat("must be an integer, got ", v.type_name(), " ", v.dump()));
}
template <>
std::string JsonReader::convert<std::string>(const std::string& key, const nlohmann::json& v) const {
  if (!v.is_string()) fail(key, str_cat("must be a string, got ", v.type_name(), " ", v.dump()));
  return v.get<std::string>();
}
template <>
std::vector<double> JsonReader::convert<std::vector<double>>(const std::string& key, const nlohmann::json& v) const {
  if (!v.is_array()) fail(key, str_cat("must be an array of numbers, got ", v.type_name()));
  std::vector<double> out;
  for (const auto& e : v) {
    if (!e.is_number()) fail(key, str_cat("must be an array of numbers, has element ", e.dump()));
    out.push_back(e.get<double>());
  }
  return out;
}

template <typename T>
T JsonReader::get(const std::string& key, const T& fallback) {
  used_.insert(key);
  if (!has(key)) return fallback;
  return convert<T>(key, obj_.at(key));
}

template <typename T>
T JsonReader::require(const std::string& key) {
  used_.insert(key);
  if (!has(key)) fail(key, "is required");
  return convert<T>(key, obj_.at(key));
}

JsonReader JsonReader::child(const std::string& key) {
  used_.insert(key);
  static const nlohmann::json empty = nlohmann::json::object();
  if (!has(key)) return JsonReader(empty, source_, key_path(key));
  return JsonReader(obj_.at(key), source_, key_path(key));
}

void JsonReader::finish() const {
  for (const auto& [key, value] : obj_.items())
    if (!used_.count(key)) throw Error(str_cat(source_, ": unknown key '", key_path(key), "'"));
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  SO_CHECK(in.good(), "cannot open ", what, " '", path, "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    SO_FAIL(what, " '", path, "' is not valid JSON: ", e.what());
  }
}

template bool JsonReader::get<bool>(const std::string&, const bool&);
template double JsonReader::get<double>(const std::string&, const double&);
template float JsonReader::get<float>(const std::string&, const float&);
template int64_t JsonReader::get<int64_t>(const std::string&, const int64_t&);
template std::string JsonReader::get<std::string>(const std::string&, const std::string&);
template std::vector<double> JsonReader::get<std::vector<double>>(const std::string&, const std::vector<double>&);
template bool JsonReader::require<bool>(const std::string&);
template double JsonReader::require<double>(const std::string&);
template int64_t JsonReader::require<int64_t>(const std::string&);
template std::string JsonReader::require<std::string>(const std::string&);

}  // namespace so
