# The peer caches cache_bench compares the epd caches with: leveldb's LRU
# cache, and RocksDB's LRUCache and HyperClockCache (Debian libleveldb-dev and
# librocksdb-dev, installed by `scripts/install-deps.sh bench`). Included by
# bench/CMakeLists.txt; bench/peers_test.py includes it alone in a small
# project to test it.
#
# Sets, for each peer:
#   LEVELDB_INCLUDE_DIR, LEVELDB_LIBRARY, ROCKSDB_INCLUDE_DIR, ROCKSDB_LIBRARY
#                          cache entries of find_path / find_library
#   EPD_BENCH_HAVE_LEVELDB, EPD_BENCH_HAVE_ROCKSDB
#                          TRUE when both the header and the library exist
# With EPD_BENCH_REQUIRE_PEERS=ON (scripts/bench.sh configures with it), a
# missing peer stops the configure with an error that names the peer and its
# Debian package, so the cache benchmark never runs without its peers.
#
# Why a bench configure re-runs the search: find_path and find_library search
# again while their cache entry is NOTFOUND, but only when CMake configures.
# A build directory configured before the packages were installed keeps its
# NOTFOUND entries (and cache_bench its peerless build) until something re-runs
# CMake, which `cmake --build` does not. So scripts/bench.sh always configures
# before it builds. A path found once also stays cached after its package is
# removed, so a cached path that no longer exists is dropped here and searched
# for again.
#
# Plain find_path / find_library rather than the packages' CMake configs:
# Debian's leveldb config names `snappy` (needs libsnappy-dev) and RocksDB's
# needs the gflags/snappy/lz4/zstd CMake packages, none of which the shared
# libraries need at link time (they carry their own DT_NEEDED entries).

option(EPD_BENCH_REQUIRE_PEERS
       "Stop the configure when a peer cache of cache_bench (leveldb, RocksDB) is missing; scripts/bench.sh sets it"
       OFF)

# _epd_find_bench_peer(PREFIX LABEL HEADER LIBRARY PACKAGE): finds HEADER and
# LIBRARY into PREFIX_INCLUDE_DIR / PREFIX_LIBRARY, sets EPD_BENCH_HAVE_PREFIX
# and, when missing, appends a line naming LABEL and PACKAGE to
# _epd_bench_missing_peers in the caller's scope.
function(_epd_find_bench_peer prefix label header library package)
  # A stale path (its package removed since) is dropped so the search runs again.
  if(DEFINED CACHE{${prefix}_INCLUDE_DIR} AND NOT "$CACHE{${prefix}_INCLUDE_DIR}" MATCHES "-NOTFOUND$"
     AND NOT EXISTS "$CACHE{${prefix}_INCLUDE_DIR}/${header}")
    message(STATUS "bench peers: cached ${prefix}_INCLUDE_DIR=$CACHE{${prefix}_INCLUDE_DIR} has no ${header}; searching again")
    unset(${prefix}_INCLUDE_DIR CACHE)
  endif()
  if(DEFINED CACHE{${prefix}_LIBRARY} AND NOT "$CACHE{${prefix}_LIBRARY}" MATCHES "-NOTFOUND$"
     AND NOT EXISTS "$CACHE{${prefix}_LIBRARY}")
    message(STATUS "bench peers: cached ${prefix}_LIBRARY=$CACHE{${prefix}_LIBRARY} no longer exists; searching again")
    unset(${prefix}_LIBRARY CACHE)
  endif()
  find_path(${prefix}_INCLUDE_DIR ${header})
  find_library(${prefix}_LIBRARY ${library})
  if(${prefix}_INCLUDE_DIR AND ${prefix}_LIBRARY)
    set(EPD_BENCH_HAVE_${prefix} TRUE PARENT_SCOPE)
    message(STATUS "bench peers: ${label}: ${${prefix}_LIBRARY}")
  else()
    set(EPD_BENCH_HAVE_${prefix} FALSE PARENT_SCOPE)
    set(line "${label} (Debian ${package}): ${header} -> ${${prefix}_INCLUDE_DIR}, lib${library} -> ${${prefix}_LIBRARY}")
    set(_epd_bench_missing_peers ${_epd_bench_missing_peers} "${line}" PARENT_SCOPE)
  endif()
endfunction()

set(_epd_bench_missing_peers)
_epd_find_bench_peer(LEVELDB leveldb leveldb/cache.h leveldb libleveldb-dev)
_epd_find_bench_peer(ROCKSDB RocksDB rocksdb/cache.h rocksdb librocksdb-dev)
# (Not `if(_epd_bench_missing_peers)`: a string ending in -NOTFOUND is false.)
list(LENGTH _epd_bench_missing_peers _epd_bench_missing_count)
if(_epd_bench_missing_count GREATER 0)
  list(JOIN _epd_bench_missing_peers "\n  " _epd_bench_missing_text)
  if(EPD_BENCH_REQUIRE_PEERS)
    message(FATAL_ERROR "cache_bench: peer cache(s) missing, and EPD_BENCH_REQUIRE_PEERS is ON:\n  "
                        "${_epd_bench_missing_text}\n"
                        "Install them with `scripts/install-deps.sh bench` and configure again.")
  endif()
  message(STATUS "cache_bench: left out the benchmarks of the missing peer(s):\n  ${_epd_bench_missing_text}")
endif()
