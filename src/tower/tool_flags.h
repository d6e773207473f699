// src/tower/tool_flags.h (tools only, not a library): the "--flag value"
// parser of the plain-main programs in this directory, checkpoint_tower_dump
// and checkpoint_tower_bench. They are built in the tower layer, which does
// not depend on CLI11 (the parser of the epd-encode CLI, tools/).
//
// Every flag takes exactly one value. Each is bound to a variable whose
// current value is the default; Parse writes the variables as it goes and
// stops at the first bad flag, naming it:
//   "flag --in needs a value", "unknown flag --x",
//   "--threads must be an integer >= 1", "--dtype must be f32 or bf16",
//   "--batches must be a comma list of integers >= 1".
//
// Usage:
//   std::string model;  int threads = 1;
//   epd::tower_tools::FlagParser flags;
//   flags.Text("--model", &model);
//   flags.Int("--threads", 0, &threads);
//   if (epd::Status s = flags.Parse(argc, argv); !s.ok()) return Fail(s.message());
//   ...
//   int main(int argc, char** argv) {
//     return epd::tower_tools::RunReportingExceptions("my_tool", Run, argc, argv);
//   }
//
// Thread safety: thread-compatible; parse on one thread. The bound variables
// must outlive Parse.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "epd/core/status.h"

namespace epd::tower_tools {

// The largest count any of these tools accepts (threads, repeats, batch).
inline constexpr long kMaxCount = 1L << 20;

// A whole number min <= n <= kMaxCount, written in decimal with nothing after it.
inline bool ParseCount(const std::string& s, int min, int* out) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0' || v < min || v > kMaxCount) return false;
  *out = static_cast<int>(v);
  return true;
}

class FlagParser {
 public:
  // Several text flags at once: {{"--model", &model}, {"--out", &out}}.
  void Texts(std::initializer_list<std::pair<const char*, std::string*>> flags) {
    for (const auto& [name, out] : flags) Text(name, out);
  }
  // Any text.
  void Text(const std::string& name, std::string* out) {
    Bind(name, "", [out](const std::string& v) {
      *out = v;
      return true;
    });
  }
  // One of `allowed`.
  void Choice(const std::string& name, std::vector<std::string> allowed, std::string* out) {
    std::string said;
    for (std::size_t i = 0; i < allowed.size(); ++i) {
      if (i > 0) said += i + 1 == allowed.size() ? " or " : ", ";
      said += allowed[i];
    }
    Bind(name, " must be " + said, [allowed = std::move(allowed), out](const std::string& v) {
      if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) return false;
      *out = v;
      return true;
    });
  }
  // An integer >= min (ParseCount).
  void Int(const std::string& name, int min, int* out) {
    Bind(name, " must be an integer >= " + std::to_string(min),
         [min, out](const std::string& v) { return ParseCount(v, min, out); });
  }
  // A comma list of at least one integer >= min ("1,2,8"); replaces *out.
  void IntList(const std::string& name, int min, std::vector<int>* out) {
    Bind(name, " must be a comma list of integers >= " + std::to_string(min), [min, out](const std::string& v) {
      std::vector<int> list;
      std::stringstream items(v);
      for (std::string item; std::getline(items, item, ',');) {
        int n = 0;
        if (!ParseCount(item, min, &n)) return false;
        list.push_back(n);
      }
      if (list.empty()) return false;
      *out = std::move(list);
      return true;
    });
  }

  // Parses argv[1..argc-1] as "--name value" pairs. InvalidArgument on a
  // flag without its value, an unknown flag, or a value the flag refuses.
  Status Parse(int argc, char** argv) const {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const auto it = flags_.find(arg);
      if (it == flags_.end()) return InvalidArgument("unknown flag " + arg);
      if (i + 1 >= argc) return InvalidArgument("flag " + arg + " needs a value");
      if (!it->second.set(argv[++i])) return InvalidArgument(arg + it->second.refusal);
    }
    return Status();
  }

 private:
  struct Flag {
    std::string refusal;                          // appended to the flag's name
    std::function<bool(const std::string&)> set;  // false: value refused
  };
  void Bind(const std::string& name, std::string refusal, std::function<bool(const std::string&)> set) {
    flags_[name] = Flag{std::move(refusal), std::move(set)};
  }

  std::map<std::string, Flag> flags_;
};

// The main() of such a tool: run's exit status, or 1 after "<tool>: <what>"
// on stderr when it throws (std::bad_alloc, or anything else unexpected).
inline int RunReportingExceptions(const char* tool, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << tool << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace epd::tower_tools
