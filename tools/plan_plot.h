// tools/plan_plot.h: the PNG `epd-encode plan --plot` draws with gnuplot
// (Debian gnuplot-nox), as bench/gnuplot_png.py does for the benchmark
// report: one encode-seconds miss-ratio curve per policy against capacity
// (log scale). gnuplot is optional: without it the plot fails with a
// message naming the package, and nothing else changes.
#pragma once

#include <string>
#include <vector>

#include "epd/core/status.h"
#include "epd/plan/miss_ratio_curve.h"

namespace epd::cli {

// Whether `gnuplot` is on PATH.
bool HaveGnuplot();

// kInvalidArgument when `png` holds a control character (plan prints the
// name), when its folder is not a directory, or when it names a directory
// or anything else that exists and is not a regular file (a FIFO would
// block; a device takes no PNG); plan checks it before any work.
Status CheckPlotFile(const std::string& png);

// Writes `png`: gnuplot draws into a temporary folder, and a non-empty PNG
// is copied over `png` (replacing a file there). kInvalidArgument as
// CheckPlotFile; kUnavailable when gnuplot is missing, fails or writes
// nothing (its stderr in the message), or the copy fails.
Status PlotCurves(const std::vector<MissRatioCurve>& curves, const std::string& title, const std::string& png);

}  // namespace epd::cli
