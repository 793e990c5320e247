// Stand-in for <fmt/format.h>, used only when the system has no fmt: MLX's
// CUDA headers call fmt::format("... {} ...", args) to build error messages,
// and that is all this provides (each "{}" is replaced by the next argument).
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace fmt {

namespace detail {
inline void put(std::ostringstream& os, std::string_view& fmt) { os << fmt; }

template <typename T, typename... Rest>
void put(std::ostringstream& os, std::string_view& fmt, const T& v,
         const Rest&... rest) {
  auto pos = fmt.find("{}");
  if (pos == std::string_view::npos) {
    os << fmt;
    return;
  }
  os << fmt.substr(0, pos) << v;
  fmt.remove_prefix(pos + 2);
  put(os, fmt, rest...);
}
}  // namespace detail

template <typename... Args>
std::string format(std::string_view fmt, const Args&... args) {
  std::ostringstream os;
  detail::put(os, fmt, args...);
  return os.str();
}

}  // namespace fmt
