"""Facts about the source tree the tests compare against, read from its files."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def project_version():
    """VERSION of project() in the top-level CMakeLists.txt."""
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"^project\(epd_encode VERSION ([0-9]+\.[0-9]+\.[0-9]+)", text, re.M).group(1)
