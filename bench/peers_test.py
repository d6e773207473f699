"""bench/peers.cmake in a scratch CMake project: a bench build finds its peers.

The scenario of issue 16: a build directory configured before leveldb and
RocksDB were installed holds NOTFOUND entries; configuring it again must find
them. Also: a cached path whose package was removed is searched for again, and
with EPD_BENCH_REQUIRE_PEERS=ON a missing peer stops the configure naming it.
"Installed" and "missing" are simulated by hiding the system prefixes from
find_* (CMAKE_IGNORE_PREFIX_PATH); the expected paths come from dpkg's file
lists of the Debian packages, not from CMake.

Run: /usr/bin/python3 -m pytest -q bench/peers_test.py (ctest: bench_peers_test).
Needs cmake and a C compiler; the found-path checks need libleveldb-dev and
librocksdb-dev (`scripts/install-deps.sh bench`) and are skipped without them.
"""

from __future__ import annotations

import os
import subprocess

import pytest

PEERS_CMAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers.cmake")
CMAKE = os.environ.get("CMAKE_COMMAND", "cmake")
VARS = ["LEVELDB_INCLUDE_DIR", "LEVELDB_LIBRARY", "ROCKSDB_INCLUDE_DIR", "ROCKSDB_LIBRARY"]
# HIDE_PREFIXES, when set, hides the system prefixes from find_* after project()
# (so the compiler checks still work): the peers look uninstalled.
PROJECT = f"""cmake_minimum_required(VERSION 3.25)
project(peers_probe C)
if(HIDE_PREFIXES)
  set(CMAKE_IGNORE_PREFIX_PATH ${{HIDE_PREFIXES}})
endif()
include({PEERS_CMAKE})
file(WRITE ${{CMAKE_BINARY_DIR}}/found.txt
  "LEVELDB_INCLUDE_DIR=${{LEVELDB_INCLUDE_DIR}}\\nLEVELDB_LIBRARY=${{LEVELDB_LIBRARY}}\\n"
  "ROCKSDB_INCLUDE_DIR=${{ROCKSDB_INCLUDE_DIR}}\\nROCKSDB_LIBRARY=${{ROCKSDB_LIBRARY}}\\n"
  "HAVE_LEVELDB=${{EPD_BENCH_HAVE_LEVELDB}}\\nHAVE_ROCKSDB=${{EPD_BENCH_HAVE_ROCKSDB}}\\n")
"""
HIDE = "-DHIDE_PREFIXES=/usr;/;/usr/local"


def dpkg_files(package: str) -> list[str]:
    r = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True)
    return r.stdout.split() if r.returncode == 0 else []


def expected_paths() -> dict[str, str] | None:
    """Where Debian put the peers' headers and libraries, from dpkg alone."""
    out = {}
    for prefix, package, header, lib in (("LEVELDB", "libleveldb-dev", "leveldb/cache.h", "libleveldb.so"),
                                         ("ROCKSDB", "librocksdb-dev", "rocksdb/cache.h", "librocksdb.so")):
        files = dpkg_files(package)
        h = [f for f in files if f.endswith("/include/" + header)]
        so = [f for f in files if os.path.basename(f) == lib]
        if not h or not so:
            return None
        out[f"{prefix}_INCLUDE_DIR"] = h[0][: -len("/" + header)]
        out[f"{prefix}_LIBRARY"] = so[0]
    return out


needs_peers = pytest.mark.skipif(expected_paths() is None,
                                 reason="libleveldb-dev / librocksdb-dev not installed (scripts/install-deps.sh bench)")


@pytest.fixture
def project(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(PROJECT)
    return src, tmp_path / "build"


def configure(project, *args: str) -> subprocess.CompletedProcess:
    src, build = project
    return subprocess.run([CMAKE, "-S", str(src), "-B", str(build), *args], capture_output=True, text=True)


def found(project) -> dict[str, str]:
    text = (project[1] / "found.txt").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if line)


@needs_peers
def test_build_configured_before_install_finds_peers_when_configured_again(project):
    # First configure: the peers are hidden (not installed yet); a plain build carries on without them.
    r = configure(project, HIDE)
    assert r.returncode == 0, r.stderr
    first = found(project)
    assert first["HAVE_LEVELDB"] == "FALSE" and first["HAVE_ROCKSDB"] == "FALSE"
    assert all(first[v] == f"{v}-NOTFOUND" for v in VARS)
    # "Install" them and configure the same build directory again, as scripts/bench.sh does.
    r = configure(project, "-UHIDE_PREFIXES", "-DEPD_BENCH_REQUIRE_PEERS=ON")
    assert r.returncode == 0, r.stderr
    again = found(project)
    want = expected_paths()
    assert {v: again[v] for v in VARS} == want
    assert again["HAVE_LEVELDB"] == "TRUE" and again["HAVE_ROCKSDB"] == "TRUE"


@needs_peers
def test_notfound_given_on_the_command_line_is_searched_again(project):
    r = configure(project, "-DEPD_BENCH_REQUIRE_PEERS=ON", *[f"-D{v}={v}-NOTFOUND" for v in VARS])
    assert r.returncode == 0, r.stderr
    assert {v: found(project)[v] for v in VARS} == expected_paths()


@needs_peers
def test_cached_path_that_no_longer_exists_is_searched_again(project):
    # A package removed (or moved) after the first configure.
    stale = ["-DLEVELDB_INCLUDE_DIR=/nonexistent/include", "-DROCKSDB_LIBRARY=/nonexistent/librocksdb.so"]
    r = configure(project, "-DEPD_BENCH_REQUIRE_PEERS=ON", *stale)
    assert r.returncode == 0, r.stderr
    assert {v: found(project)[v] for v in VARS} == expected_paths()
    assert "ROCKSDB_LIBRARY=/nonexistent/librocksdb.so no longer exists" in r.stdout


def test_missing_peers_stop_a_bench_configure_naming_each(project):
    r = configure(project, HIDE, "-DEPD_BENCH_REQUIRE_PEERS=ON")
    assert r.returncode != 0
    for name in ("leveldb (Debian libleveldb-dev)", "RocksDB (Debian librocksdb-dev)",
                 "scripts/install-deps.sh bench"):
        assert name in r.stderr, r.stderr


def test_missing_peers_are_named_but_a_plain_build_carries_on(project):
    r = configure(project, HIDE)
    assert r.returncode == 0, r.stderr
    assert "leveldb (Debian libleveldb-dev)" in r.stdout and "RocksDB (Debian librocksdb-dev)" in r.stdout
    assert found(project)["HAVE_ROCKSDB"] == "FALSE"
