// gnuplot reads the script from a file and the curves from one data file
// per curve, all in a fresh temporary directory removed afterwards.
#include "plan_plot.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli_util.h"

namespace epd::cli {

bool HaveGnuplot() {
  // Called on plan's main thread before any task starts, and nothing sets the environment.
  // NOLINTNEXTLINE(concurrency-mt-unsafe)
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::stringstream dirs(path);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (!dir.empty() && access((dir + "/gnuplot").c_str(), X_OK) == 0) return true;
  }
  return false;
}

namespace {

bool IsControl(char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }

// `s` as a gnuplot single-quoted string: a quote doubled, the only escape
// such a string has (gnuplot 5 manual, "Strings"). Control characters, which
// it cannot hold, become '?'.
std::string GnuplotQuoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "''";
    else
      out += IsControl(c) ? '?' : c;
  }
  return out + "'";
}

}  // namespace

Status CheckPlotFile(const std::string& png) {
  if (std::any_of(png.begin(), png.end(), IsControl)) {
    return Status(StatusCode::kInvalidArgument, "--plot: a file name with a control character");
  }
  // Before any work: a folder that is not there, or a name that is one.
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path parent = fs::path(png).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec)) {
    return Status(StatusCode::kInvalidArgument, "--plot: " + parent.string() + " is not a directory");
  }
  if (fs::is_directory(png, ec)) return Status(StatusCode::kInvalidArgument, "--plot: " + png + " is a directory");
  // A FIFO would block gnuplot's open; a device or /proc file takes no PNG.
  if (fs::exists(png, ec) && !fs::is_regular_file(png, ec)) {
    return Status(StatusCode::kInvalidArgument, "--plot: " + png + " exists and is not a regular file");
  }
  return Status::Ok();
}

Status PlotCurves(const std::vector<MissRatioCurve>& curves, const std::string& title, const std::string& png) {
  namespace fs = std::filesystem;
  if (Status s = CheckPlotFile(png); !s.ok()) return s;
  if (!HaveGnuplot()) {
    return Status(StatusCode::kUnavailable, "gnuplot not found on PATH (Debian package gnuplot-nox); no plot written");
  }
  char tmpl[] = "/tmp/epd-plan-plot-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Status(StatusCode::kUnavailable, "cannot create a temporary directory");
  const fs::path dir(tmpl);
  std::string plots;
  for (std::size_t i = 0; i < curves.size(); ++i) {
    std::ofstream d(dir / fmt::format("c{}.dat", i));
    for (const CurvePoint& p : curves[i].points) d << p.capacity_bytes / 1e9 << ' ' << p.miss_ratio.seconds << '\n';
    plots += fmt::format("{}'c{}.dat' using 1:2 with linespoints title {}", i == 0 ? "" : ", ", i,
                         GnuplotQuoted(curves[i].label));
  }
  // Every name from outside (the PNG's path, the title from the trace's) is
  // quoted: unquoted, a quote in a file name ended the string and let the
  // rest run as gnuplot commands (`system` among them).
  const std::string script = fmt::format(
      "set terminal pngcairo size 960,540 noenhanced font ',10'\nset output {}\nset title {}\n"
      "set logscale x\nset xlabel 'cache capacity (GB)'\nset ylabel 'miss ratio, by encode seconds'\n"
      "set yrange [0:1]\nset grid\nset key top right\nplot {}\n",
      GnuplotQuoted((dir / "out.png").string()), GnuplotQuoted(title), plots);
  std::ofstream(dir / "plot.gp") << script;
  const std::string cmd = fmt::format("cd '{}' && gnuplot plot.gp 2> err.txt", dir.string());
  // On plan's main thread after every task has joined; the shell does the cd and the redirect.
  // NOLINTNEXTLINE(concurrency-mt-unsafe)
  const int rc = std::system(cmd.c_str());
  StatusOr<std::string> err = ReadFile((dir / "err.txt").string());
  // gnuplot draws into the temporary folder, and the PNG is copied out only
  // when it holds something: gnuplot exits 0 also where it could not write,
  // and a file left at `png` by an earlier run must not pass for this one.
  std::error_code ec;
  const bool drawn = rc == 0 && fs::file_size(dir / "out.png", ec) > 0 && !ec;
  const std::string said = err.ok() && !err->empty() ? *err : "it wrote no PNG";
  std::error_code copy_ec;
  const bool copied =
      drawn && fs::copy_file(dir / "out.png", png, fs::copy_options::overwrite_existing, copy_ec) && !copy_ec;
  fs::remove_all(dir, ec);
  if (!drawn) return Status(StatusCode::kUnavailable, "gnuplot failed for " + png + ": " + said);
  if (!copied) return Status(StatusCode::kUnavailable, "cannot write the plot to " + png + ": " + copy_ec.message());
  return Status::Ok();
}

}  // namespace epd::cli
