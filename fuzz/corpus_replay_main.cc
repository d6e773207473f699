// Runs every file under the given paths (files or directories, recursively)
// through LLVMFuzzerTestOneInput once. Built with any compiler so CTest can
// replay the seed corpus (and any crash reproducer added to it) without
// libFuzzer. Exit status 0 when every input ran; a violated invariant aborts.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "%s: %s is not a file or directory\n", argv[0], argv[i]);
      return 2;
    }
  }
  std::sort(files.begin(), files.end());  // deterministic order
  if (files.empty()) {
    std::fprintf(stderr, "%s: no inputs (usage: %s DIR_OR_FILE...)\n", argv[0], argv[0]);
    return 2;
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // A non-null pointer even for empty files, as libFuzzer passes.
    static const std::uint8_t kEmpty = 0;
    LLVMFuzzerTestOneInput(bytes.empty() ? &kEmpty : bytes.data(), bytes.size());
  }
  std::printf("%s: %zu inputs ran\n", argv[0], files.size());
  return 0;
}
