#pragma once
// One error type for the whole project, and one CHECK macro per failure source. Every error says
// where it happened (file:line, and rank once MPI is up) and what it was about.
#include <sstream>
#include <stdexcept>
#include <string>

namespace so {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Set once MPI knows the rank, so every message names it. -1 means "not distributed (yet)".
void set_error_rank(int rank);
int error_rank();

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... R>
void append(std::ostringstream& os, const T& v, const R&... rest) {
  os << v;
  append(os, rest...);
}
}  // namespace detail

template <typename... A>
std::string str_cat(const A&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  return os.str();
}

}  // namespace so

// SO_CHECK(cond, parts...): throw so::Error with the message built from parts.
#define SO_CHECK(cond, ...)                                                         \
  do {                                                                              \
    if (!(cond)) ::so::throw_error(__FILE__, __LINE__, ::so::str_cat(__VA_ARGS__)); \
  } while (0)

#define SO_FAIL(...) ::so::throw_error(__FILE__, __LINE__, ::so::str_cat(__VA_ARGS__))
