// preprocess_bench: the C++ contenders of issue 42's benchmark (preprocessing
// against the JPEG-decode floor), timed on request so that
// bench/preprocess_bench.py can interleave them with its Python contenders
// (Pillow + numpy, torchvision) in one run.
//
// Contenders, each over a set of JPEG files held in memory:
//   epd         epd::DecodeAndPreprocess with the default PreprocessConfig
//               (Qwen2-VL): the product's path, bytes to patch rows;
//   dct         the same with PreprocessConfig::jpeg_dct_scaling on (a JPEG
//               at least twice its resized size decodes DCT-scaled; not
//               Pillow's pixels, off by default);
//   decode      epd::DecodeImage alone (its first half);
//   preprocess  epd::Preprocess alone, on images decoded once beforehand
//               (its second half: smart_resize, resize, normalise, patchify);
//   probe       epd::ProbeItems on a one-image request (issue 42 section 5):
//               the content key's hash plus the header grid, no decode;
//   probe_header  epd::ProbeGrid alone, the header grid without the key;
//   turbojpeg   tjDecompress2 to RGB8 with one reused handle and one reused
//               output buffer, the same settings as DecodeImage (accurate
//               integer IDCT, fancy upsampling): the floor any decoder of
//               these files pays.
//
// Protocol (stdin, one command a line; one JSON object a line on stdout):
//   load LABEL FILE...            -> {"label", "images", "grids": [[t,h,w],...]}
//   run CONTENDER LABEL SECONDS THREADS
//       -> {"contender", "label", "threads", "images", "wall_s", "cpu_s"}
//   quit
// `run` first makes one untimed pass over the set on each thread (warm-up),
// then each of THREADS threads loops over the set, starting at a different
// file, until SECONDS of wall time have passed (checked after each image);
// images is the total over threads, cpu_s the process CPU time spent in the
// timed part (CLOCK_PROCESS_CPUTIME_ID), so images / cpu_s is images per
// core-second whatever else the machine runs. Errors: {"error": "..."}.
//
// Usage: printf 'load s /tmp/a.jpg\nrun epd s 1 1\n' | preprocess_bench

#include <turbojpeg.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "epd/media/image.h"
#include "epd/media/preprocess.h"
#include "epd/worker/item_probe.h"

namespace {

struct ImageSet {
  std::vector<std::vector<std::uint8_t>> files;
  std::vector<epd::RgbImage> decoded;  // for the preprocess contender
};

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += (c == '\n') ? ' ' : c;
  }
  return out + "\"";
}

// One contender's work on one thread: Run(i) processes image i of the set
// and returns false on an error (kept in `error`).
class Worker {
 public:
  Worker(const std::string& contender, const ImageSet& set) : contender_(contender), set_(set) {}
  ~Worker() {
    if (tj_ != nullptr) tjDestroy(tj_);
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  bool Valid() const {
    return contender_ == "epd" || contender_ == "dct" || contender_ == "decode" || contender_ == "preprocess" ||
           contender_ == "turbojpeg" || contender_ == "probe" || contender_ == "probe_header";
  }

  bool Run(std::size_t i) {
    const auto& bytes = set_.files[i];
    if (contender_ == "epd") {
      auto pre = epd::DecodeAndPreprocess(bytes, cfg_);
      return Keep(pre.ok() ? epd::Status() : pre.status(), pre.ok() ? pre->patches.size() : 0);
    }
    if (contender_ == "dct") {
      epd::PreprocessConfig dct = cfg_;
      dct.jpeg_dct_scaling = true;
      auto pre = epd::DecodeAndPreprocess(bytes, dct);
      return Keep(pre.ok() ? epd::Status() : pre.status(), pre.ok() ? pre->patches.size() : 0);
    }
    if (contender_ == "decode") {
      auto img = epd::DecodeImage(bytes, {}, cfg_.decode);
      return Keep(img.ok() ? epd::Status() : img.status(), img.ok() ? img->pixels.size() : 0);
    }
    if (contender_ == "preprocess") {
      auto pre = epd::Preprocess(set_.decoded[i], cfg_);
      return Keep(pre.ok() ? epd::Status() : pre.status(), pre.ok() ? pre->patches.size() : 0);
    }
    if (contender_ == "probe" || contender_ == "probe_header") return Probe(i);
    return TurboJpeg(bytes);
  }

  const std::string& error() const { return error_; }
  std::size_t sink() const { return sink_; }

 private:
  bool Keep(const epd::Status& s, std::size_t n) {
    if (!s.ok()) {
      error_ = s.ToString();
      return false;
    }
    sink_ += n;
    return true;
  }

  // The probe contenders; the requests are built once (untimed warm-up),
  // sharing nothing with the set's buffers, so no copy is timed.
  bool Probe(std::size_t i) {
    if (requests_.empty()) {
      probe_options_.model_id = "preprocess-bench";
      for (const auto& f : set_.files) {
        requests_.emplace_back().items.emplace_back().media = std::string(f.begin(), f.end());
      }
    }
    const epd::MediaBytes& media = requests_[i].items[0].media;
    if (contender_ == "probe_header") {
      auto grid = epd::ProbeGrid(media.span(), cfg_);
      return Keep(grid.ok() ? epd::Status() : grid.status(), grid.ok() ? grid->grid.tokens() : 0);
    }
    auto probed = epd::ProbeItems(probe_options_, requests_[i]);
    return Keep(probed[0].ok() ? epd::Status() : probed[0].status(), probed[0].ok() ? probed[0]->key.bytes[0] : 0);
  }

  bool TurboJpeg(const std::vector<std::uint8_t>& bytes) {
    if (tj_ == nullptr) tj_ = tjInitDecompress();
    int w = 0, h = 0, subsamp = 0, cs = 0;
    const auto size = static_cast<unsigned long>(bytes.size());
    if (tj_ == nullptr || tjDecompressHeader3(tj_, bytes.data(), size, &w, &h, &subsamp, &cs) != 0) {
      error_ = std::string("TurboJPEG header: ") + tjGetErrorStr2(tj_);
      return false;
    }
    const std::size_t need = static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * 3;
    if (buffer_.size() < need) buffer_.resize(need);
    if (tjDecompress2(tj_, bytes.data(), size, buffer_.data(), w, w * 3, h, TJPF_RGB, 0) != 0) {
      error_ = std::string("TurboJPEG: ") + tjGetErrorStr2(tj_);
      return false;
    }
    sink_ += buffer_[need / 2];
    return true;
  }

  std::string contender_;
  const ImageSet& set_;
  epd::PreprocessConfig cfg_;
  tjhandle tj_ = nullptr;
  std::vector<std::uint8_t> buffer_;
  epd::WorkerOptions probe_options_;
  std::vector<epd::EncodeRequest> requests_;
  std::string error_;
  std::size_t sink_ = 0;
};

std::string Load(std::map<std::string, ImageSet>& sets, std::istringstream& in) {
  std::string label, path;
  in >> label;
  ImageSet set;
  std::string grids;
  epd::PreprocessConfig cfg;
  while (in >> path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return "{\"error\": " + Quote("cannot read " + path) + "}";
    set.files.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    auto img = epd::DecodeImage(set.files.back(), {}, cfg.decode);
    if (!img.ok()) return "{\"error\": " + Quote(path + ": " + img.status().ToString()) + "}";
    auto grid = epd::GridForImage(img->height, img->width, cfg);
    if (!grid.ok()) return "{\"error\": " + Quote(path + ": " + grid.status().ToString()) + "}";
    grids += std::string(grids.empty() ? "" : ", ") + "[" + std::to_string(grid->t) + ", " + std::to_string(grid->h) +
             ", " + std::to_string(grid->w) + "]";
    set.decoded.push_back(*std::move(img));
  }
  if (label.empty() || set.files.empty()) return R"({"error": "load needs a label and at least one file"})";
  const std::size_t n = set.files.size();
  sets[label] = std::move(set);
  return "{\"label\": " + Quote(label) + ", \"images\": " + std::to_string(n) + ", \"grids\": [" + grids + "]}";
}

std::string Run(const std::map<std::string, ImageSet>& sets, std::istringstream& in) {
  std::string contender, label;
  double seconds = 0;
  int threads = 0;
  in >> contender >> label >> seconds >> threads;
  auto it = sets.find(label);
  if (it == sets.end()) return "{\"error\": " + Quote("no image set " + label) + "}";
  if (threads < 1 || threads > 256 || !(seconds > 0)) return R"({"error": "run needs SECONDS > 0 and THREADS >= 1"})";
  const ImageSet& set = it->second;
  const std::size_t n = set.files.size();
  std::vector<std::unique_ptr<Worker>> workers;
  for (int t = 0; t < threads; ++t) {
    workers.push_back(std::make_unique<Worker>(contender, set));
    if (!workers.back()->Valid()) return "{\"error\": " + Quote("unknown contender " + contender) + "}";
    for (std::size_t i = 0; i < n; ++i) {
      if (!workers.back()->Run(i)) return "{\"error\": " + Quote(workers.back()->error()) + "}";
    }
  }
  std::vector<std::uint64_t> counts(threads, 0);
  std::atomic<bool> failed{false};
  const auto wall0 = std::chrono::steady_clock::now();
  const auto deadline = wall0 + std::chrono::duration<double>(seconds);
  const double cpu0 = ProcessCpuSeconds();
  auto loop = [&](int t) {
    std::size_t i = static_cast<std::size_t>(t) % n;
    do {
      if (!workers[t]->Run(i)) {
        failed = true;
        return;
      }
      ++counts[t];
      i = (i + 1) % n;
    } while (std::chrono::steady_clock::now() < deadline);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(loop, t);
  loop(0);
  for (auto& th : pool) th.join();
  const double cpu = ProcessCpuSeconds() - cpu0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  if (failed) {
    for (const auto& w : workers) {
      if (!w->error().empty()) return "{\"error\": " + Quote(w->error()) + "}";
    }
  }
  std::uint64_t images = 0;
  for (auto c : counts) images += c;
  std::ostringstream out;
  out.precision(9);
  out << "{\"contender\": " << Quote(contender) << ", \"label\": " << Quote(label) << ", \"threads\": " << threads
      << ", \"images\": " << images << ", \"wall_s\": " << wall << ", \"cpu_s\": " << cpu << "}";
  return out.str();
}

}  // namespace

int main() {
  std::map<std::string, ImageSet> sets;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd.empty()) continue;
    if (cmd == "quit") break;
    std::string reply;
    if (cmd == "load") {
      reply = Load(sets, in);
    } else if (cmd == "run") {
      reply = Run(sets, in);
    } else {
      reply = "{\"error\": " + Quote("unknown command " + cmd) + "}";
    }
    std::cout << reply << std::endl;
  }
  return 0;
}
