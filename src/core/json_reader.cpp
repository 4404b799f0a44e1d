#include "so/core/json_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstring>

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
  // Hugging Face's DeepSpeed integration writes "auto" and fills it in before DeepSpeed reads the
  // file; a file with "auto" left in it is not one DeepSpeed itself accepts either.
  const bool is_auto =
      obj_.contains(key) && obj_.at(key).is_string() && obj_.at(key).get_ref<const std::string&>() == "auto";
  throw Error(str_cat(
      source_, ": '", key_path(key), "' ", msg,
      is_auto ? " (\"auto\" is filled in by the Hugging Face Trainer from its own arguments; give the value)" : ""));
}

bool JsonReader::has(const std::string& key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }

void JsonReader::accept(const std::string& key) { used_.insert(key); }

template <>
bool JsonReader::convert<bool>(const std::string& key, const nlohmann::json& v) const {
  if (!v.is_boolean()) fail(key, str_cat("must be true or false, got ", v.type_name(), " ", brief_json(v)));
  return v.get<bool>();
}
template <>
double JsonReader::convert<double>(const std::string& key, const nlohmann::json& v) const {
  if (!v.is_number()) fail(key, str_cat("must be a number, got ", v.type_name(), " ", brief_json(v)));
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail(key, str_cat("must be a finite number, got ", brief_json(v)));
  return d;
}
template <>
float JsonReader::convert<float>(const std::string& key, const nlohmann::json& v) const {
  const double d = convert<double>(key, v);
  if (std::fabs(d) > FLT_MAX) fail(key, str_cat("is ", d, ", outside the range of a 32-bit float (+-3.4e38)"));
  return static_cast<float>(d);
}
template <>
int64_t JsonReader::convert<int64_t>(const std::string& key, const nlohmann::json& v) const {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail(key, str_cat("is ", v.get<uint64_t>(), ", above the largest integer accepted (2^63 - 1)"));
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  fail(key, str_cat("must be an integer, got ", v.type_name(), " ", brief_json(v)));
}
template <>
std::string JsonReader::convert<std::string>(const std::string& key, const nlohmann::json& v) const {
  if (!v.is_string()) fail(key, str_cat("must be a string, got ", v.type_name(), " ", brief_json(v)));
  return v.get<std::string>();
}
template <>
std::vector<double> JsonReader::convert<std::vector<double>>(const std::string& key, const nlohmann::json& v) const {
  if (!v.is_array()) fail(key, str_cat("must be an array of numbers, got ", v.type_name()));
  std::vector<double> out;
  for (const auto& e : v) {
    if (!e.is_number()) fail(key, str_cat("must be an array of numbers, has element ", brief_json(e)));
    out.push_back(convert<double>(key, e));
  }
  return out;
}
template <>
std::vector<std::string> JsonReader::convert<std::vector<std::string>>(const std::string& key,
                                                                       const nlohmann::json& v) const {
  if (!v.is_array()) fail(key, str_cat("must be an array of strings, got ", v.type_name()));
  std::vector<std::string> out;
  for (const auto& e : v) {
    if (!e.is_string()) fail(key, str_cat("must be an array of strings, has element ", brief_json(e)));
    out.push_back(e.get<std::string>());
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

int64_t JsonReader::get_in(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) {
  used_.insert(key);
  if (!has(key)) return fallback;
  const int64_t v = convert<int64_t>(key, obj_.at(key));
  if (v < lo || v > hi) fail(key, str_cat("must be in [", lo, ", ", hi, "], got ", v));
  return v;
}

int64_t JsonReader::require_in(const std::string& key, int64_t lo, int64_t hi) {
  if (!has(key)) fail(key, "is missing");
  return get_in(key, 0, lo, hi);
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

namespace {

// Writes v into out until out holds `budget` characters; false when it had to stop early.
bool write_brief(const nlohmann::json& v, std::string& out, size_t budget) {
  const auto replace = nlohmann::json::error_handler_t::replace;  // a cut may split a UTF-8 sequence
  if (out.size() >= budget) return false;
  if (v.is_string()) {
    const auto& text = v.get_ref<const std::string&>();
    const size_t room = budget - out.size();
    if (text.size() + 2 <= room) {
      out += v.dump(-1, ' ', false, replace);
      return true;
    }
    out += nlohmann::json(text.substr(0, room)).dump(-1, ' ', false, replace);
    return false;
  }
  if (!v.is_structured()) {
    out += v.dump();
    return out.size() <= budget;
  }
  out += v.is_array() ? '[' : '{';
  bool first = true;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!first) out += ", ";
    first = false;
    if (v.is_object()) out += nlohmann::json(it.key()).dump(-1, ' ', false, replace) + ": ";
    if (!write_brief(*it, out, budget)) return false;
  }
  out += v.is_array() ? ']' : '}';
  return out.size() <= budget;
}

}  // namespace

std::string brief_json(const nlohmann::json& v) {
  std::string out;
  if (write_brief(v, out, 96)) return out;
  const std::string what = v.is_string()   ? str_cat(v.get_ref<const std::string&>().size(), " characters")
                           : v.is_array()  ? str_cat("an array of ", v.size(), " elements")
                           : v.is_object() ? str_cat("an object with ", v.size(), " keys")
                                           : "a value";
  return str_cat(out, "... (", what, ")");
}

nlohmann::json parse_json_text(std::string_view text, const std::string& source) {
  using Event = nlohmann::json::parse_event_t;
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;  // the key being read
  };
  std::vector<Frame> open;
  auto path_to = [&](const std::string& key) {
    std::string path;
    for (size_t i = 0; i + 1 < open.size(); ++i)
      path += open[i].object ? (path.empty() ? "" : ".") + open[i].key : "[]";
    return path + (path.empty() ? "" : ".") + key;
  };
  const nlohmann::json::parser_callback_t check = [&](int depth, Event event, nlohmann::json& parsed) {
    if (depth > kMaxJsonDepth) throw Error(str_cat(source, " is nested deeper than ", kMaxJsonDepth, " levels"));
    switch (event) {
      case Event::object_start: open.push_back(Frame{true, {}, {}}); break;
      case Event::array_start: open.push_back(Frame{false, {}, {}}); break;
      case Event::object_end:
      case Event::array_end: open.pop_back(); break;
      case Event::key: {
        std::string key = parsed.get<std::string>();
        if (!open.back().keys.insert(key).second) throw Error(str_cat(source, ": duplicate key '", path_to(key), "'"));
        open.back().key = std::move(key);
        break;
      }
      case Event::value: break;
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), check);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str_cat(source, " is not valid JSON: ", e.what()));
  }
}

nlohmann::json read_json_file(const std::string& path, const std::string& what, int64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  SO_CHECK(fd >= 0, "cannot open ", what, " '", path, "': ", std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  SO_CHECK(::fstat(fd, &st) == 0, "cannot stat ", what, " '", path, "': ", std::strerror(errno));
  SO_CHECK(!S_ISDIR(st.st_mode), what, " '", path, "' is a directory; give a JSON file");
  SO_CHECK(S_ISREG(st.st_mode), what, " '", path,
           "' is not a regular file (a FIFO, socket or device); give a JSON file");
  SO_CHECK(st.st_size <= max_bytes, what, " '", path, "' is ", st.st_size, " bytes; more than the ", max_bytes,
           " accepted for a ", what);
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    SO_CHECK(n > 0, "reading ", what, " '", path, "' failed",
             n < 0 ? str_cat(": ", std::strerror(errno)) : " (shorter than its size)");
    got += static_cast<size_t>(n);
  }
  return parse_json_text(text, str_cat(what, " '", path, "'"));
}

template bool JsonReader::get<bool>(const std::string&, const bool&);
template double JsonReader::get<double>(const std::string&, const double&);
template float JsonReader::get<float>(const std::string&, const float&);
template int64_t JsonReader::get<int64_t>(const std::string&, const int64_t&);
template std::string JsonReader::get<std::string>(const std::string&, const std::string&);
template std::vector<double> JsonReader::get<std::vector<double>>(const std::string&, const std::vector<double>&);
template std::vector<std::string> JsonReader::get<std::vector<std::string>>(const std::string&,
                                                                            const std::vector<std::string>&);
template bool JsonReader::require<bool>(const std::string&);
template double JsonReader::require<double>(const std::string&);
template int64_t JsonReader::require<int64_t>(const std::string&);
template std::string JsonReader::require<std::string>(const std::string&);

}  // namespace so
