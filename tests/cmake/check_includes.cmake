# ctest layering_includes_test: the layer table of cmake/epd_layers.cmake
# against the code and the docs.
#   cmake -DROOT=<source dir> -DBUILD=<build dir> -DSOURCES_FILE=<build>/epd_layer_sources.cmake \
#         -P check_includes.cmake
# Checks, naming every offence:
#   1. each header under include/epd/ sits in the folder of the one layer
#      that lists it (include/epd/<layer>/), and each listed header exists
#      (core's version.h is generated into the build tree);
#   2. each public header, and each source of a layer's library (with the
#      private headers it includes from its own directory), includes only
#      epd/ headers of its own layer or of a layer it may use, except the
#      known violations listed in cmake/epd_layers.cmake, each of which
#      must still occur; and a private header it includes from another
#      layer's source directory ("x.h" found there, or "../dir/x.h") must be
#      of a directory that holds sources of its own layer or of one it may
#      use (so the server cannot reach into src/client/, whose sources are
#      the client's alone, while both use src/server/'s rpc headers);
#   3. docs/ARCHITECTURE.md's layer table names, per target, exactly the
#      headers the table here gives it.
# SOURCES_FILE (written by the top-level CMakeLists.txt) sets
# EPD_LAYER_<L>_SOURCES to the absolute sources of each layer's target.
cmake_minimum_required(VERSION 3.25)
if(NOT ROOT OR NOT BUILD OR NOT SOURCES_FILE)
  message(FATAL_ERROR "pass -DROOT=<source dir> -DBUILD=<build dir> -DSOURCES_FILE=<build>/epd_layer_sources.cmake")
endif()
include(${ROOT}/cmake/epd_layers.cmake)
include(${SOURCES_FILE})
set(generated_headers version.h)
set(errors "")

# Source directory -> the layers whose library sources it holds (one
# directory may hold several: src/server holds rpc and server).
set(layer_dirs "")
foreach(layer ${EPD_LAYERS})
  foreach(src ${EPD_LAYER_${layer}_SOURCES})
    string(FIND "${src}" "${ROOT}/" in_root)
    string(FIND "${src}" "${BUILD}/" in_build)
    if(in_root EQUAL 0 AND NOT in_build EQUAL 0)
      get_filename_component(d ${src} DIRECTORY)
      string(MAKE_C_IDENTIFIER "${d}" id)
      if(NOT layer IN_LIST dir_layers_${id})
        list(APPEND dir_layers_${id} ${layer})
      endif()
      if(NOT d IN_LIST layer_dirs)
        list(APPEND layer_dirs ${d})
      endif()
    endif()
  endforeach()
endforeach()

# 1. header -> layer. A public header lives in its layer's folder,
# include/epd/<layer>/, so the folder of an include line is its layer.
foreach(layer ${EPD_LAYERS})
  foreach(h ${EPD_LAYER_${layer}_HEADERS})
    if(NOT EXISTS ${ROOT}/include/epd/${layer}/${h} AND NOT h IN_LIST generated_headers)
      string(APPEND errors "\n  epd/${layer}/${h} (layer ${layer}) does not exist under include/epd/${layer}/")
    endif()
  endforeach()
endforeach()
file(GLOB loose_headers RELATIVE ${ROOT}/include/epd ${ROOT}/include/epd/*.h)
foreach(h ${loose_headers})
  string(APPEND errors "\n  include/epd/${h} is in no layer's folder: move it to include/epd/<layer>/ and list "
                       "it in cmake/epd_layers.cmake and docs/ARCHITECTURE.md")
endforeach()
file(GLOB public_headers RELATIVE ${ROOT}/include/epd ${ROOT}/include/epd/*/*.h ${ROOT}/include/epd/*/internal/*.h)
foreach(rel_h ${public_headers})
  # <layer>/<name>.h or <layer>/internal/<name>.h, listed as internal/<name>.h
  string(REGEX REPLACE "/.*" "" folder ${rel_h})
  string(REGEX MATCH "^[^/]+/(.*)$" h ${rel_h})
  set(h ${CMAKE_MATCH_1})
  if(NOT folder IN_LIST EPD_LAYERS)
    string(APPEND errors "\n  include/epd/${rel_h}: ${folder} is not a layer of cmake/epd_layers.cmake")
  elseif(NOT h IN_LIST EPD_LAYER_${folder}_HEADERS)
    string(APPEND errors "\n  include/epd/${rel_h} is not listed in EPD_LAYER_${folder}_HEADERS: add it to "
                         "cmake/epd_layers.cmake and docs/ARCHITECTURE.md")
  endif()
endforeach()

# 2. includes. check_file(<file> <layer>) appends to `errors` and, for the
# file's own-directory includes ("x.h"), checks those files as the same layer.
function(check_file path layer)
  get_property(seen GLOBAL PROPERTY _epd_checked)
  if(path IN_LIST seen)
    return()
  endif()
  set_property(GLOBAL APPEND PROPERTY _epd_checked ${path})
  file(STRINGS ${path} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  get_filename_component(dir ${path} DIRECTORY)
  file(RELATIVE_PATH rel ${ROOT} ${path})
  foreach(line ${lines})
    if(line MATCHES "\"epd/([A-Za-z0-9_]+)/((internal/)?[A-Za-z0-9_]+\\.h)\"")
      set(owner ${CMAKE_MATCH_1})
      set(h ${owner}/${CMAKE_MATCH_2})
      if(NOT owner IN_LIST EPD_LAYERS)
        # A folder that is no layer: generated code (epd/v1/, the gRPC
        # stubs and service config) unless it is under include/epd/.
        if(EXISTS ${ROOT}/include/epd/${owner})
          string(APPEND errors "\n  ${rel} includes epd/${h}, which is in no layer")
        endif()
      elseif(NOT CMAKE_MATCH_2 IN_LIST EPD_LAYER_${owner}_HEADERS)
        string(APPEND errors "\n  ${rel} includes epd/${h}, which layer ${owner} does not list")
      elseif("${rel}>${h}" IN_LIST EPD_LAYER_KNOWN_VIOLATIONS)
        set_property(GLOBAL APPEND PROPERTY _epd_known_seen "${rel}>${h}")
      elseif(NOT owner STREQUAL layer AND NOT owner IN_LIST EPD_LAYER_${layer}_USES)
        string(APPEND errors "\n  ${rel} (layer ${layer}) includes epd/${h} (layer ${owner}), which "
                             "${layer} may not use")
      endif()
    elseif(line MATCHES "\"epd/([A-Za-z0-9_]+\\.h)\"")
      string(APPEND errors "\n  ${rel} includes epd/${CMAKE_MATCH_1}: public headers are included as "
                           "epd/<layer>/${CMAKE_MATCH_1}")
    elseif(line MATCHES "\"([A-Za-z0-9_./]+\\.h)\"")
      # A second step: ${CMAKE_MATCH_1} in the same if() would be expanded
      # before MATCHES sets it. A private header of another directory (e.g.
      # media's digest.h, on epd_model's include path) is not followed here;
      # its own directory's sources cover it. Its directory must be one of a
      # layer this one may use.
      set(inc ${CMAKE_MATCH_1})
      get_filename_component(local ${dir}/${inc} ABSOLUTE)
      get_filename_component(local_dir ${local} DIRECTORY)
      if(EXISTS ${local} AND local_dir STREQUAL dir)
        check_file(${local} ${layer})
      else()
        set(found_dirs "")
        if(EXISTS ${local})
          list(APPEND found_dirs ${local_dir})
        elseif(NOT inc MATCHES "/")
          foreach(d ${layer_dirs})
            if(EXISTS ${d}/${inc})
              list(APPEND found_dirs ${d})
            endif()
          endforeach()
        endif()
        # An offence only when no directory it may come from is allowed (a
        # bare name may exist in several; one outside every layer's sources,
        # e.g. src/testing, is not judged here).
        set(allowed FALSE)
        set(refused "")
        foreach(d ${found_dirs})
          string(MAKE_C_IDENTIFIER "${d}" id)
          if(NOT DEFINED dir_layers_${id})
            set(allowed TRUE)
          endif()
          foreach(owner ${dir_layers_${id}})
            if(owner STREQUAL layer OR owner IN_LIST EPD_LAYER_${layer}_USES)
              set(allowed TRUE)
            endif()
          endforeach()
          file(RELATIVE_PATH drel ${ROOT} ${d})
          string(REPLACE ";" "," owners "${dir_layers_${id}}")
          list(APPEND refused "${drel}/ (sources of ${owners})")
        endforeach()
        if(found_dirs AND NOT allowed)
          string(REPLACE ";" ", " refused "${refused}")
          string(APPEND errors "\n  ${rel} (layer ${layer}) includes ${inc} from ${refused}, which ${layer} "
                               "may not use")
        endif()
      endif()
    endif()
  endforeach()
  set(errors "${errors}" PARENT_SCOPE)
endfunction()
foreach(rel_h ${public_headers})
  string(REGEX REPLACE "/.*" "" folder ${rel_h})
  if(folder IN_LIST EPD_LAYERS)
    check_file(${ROOT}/include/epd/${rel_h} ${folder})
  endif()
endforeach()
foreach(layer ${EPD_LAYERS})
  foreach(src ${EPD_LAYER_${layer}_SOURCES})
    # Generated sources (under the build directory) are not ours to check.
    string(FIND "${src}" "${ROOT}/" in_root)
    string(FIND "${src}" "${BUILD}/" in_build)
    if(src MATCHES "\\.(cc|cu|h)$" AND in_root EQUAL 0 AND NOT in_build EQUAL 0)
      check_file(${src} ${layer})
    endif()
  endforeach()
endforeach()

get_property(known_seen GLOBAL PROPERTY _epd_known_seen)
foreach(v ${EPD_LAYER_KNOWN_VIOLATIONS})
  if(NOT v IN_LIST known_seen)
    string(APPEND errors "\n  EPD_LAYER_KNOWN_VIOLATIONS lists ${v}, which no longer occurs: delete it "
                         "(cmake/epd_layers.cmake)")
  endif()
endforeach()

# 3. the docs' table: rows "| `epd::<layer>` ... | depends on | `a.h`, `b.h` | holds |"
file(STRINGS ${ROOT}/docs/ARCHITECTURE.md rows REGEX "^\\| `epd")
set(documented "")
foreach(row ${rows})
  string(REPLACE ";" "," row "${row}")
  string(REPLACE "|" ";" cells "${row}")
  list(LENGTH cells n)
  if(n LESS 5)
    continue()
  endif()
  list(GET cells 1 name_cell)
  list(GET cells 3 header_cell)
  if(name_cell MATCHES "`epd::([a-z0-9_]+)`")
    set(layer ${CMAKE_MATCH_1})
  elseif(name_cell MATCHES "`epd_proto`")
    set(layer rpc)
  elseif(name_cell MATCHES "`epd` \\(Python\\)")
    set(layer python)
  else()
    string(APPEND errors "\n  docs/ARCHITECTURE.md: row '${name_cell}' names no layer")
    continue()
  endif()
  if(NOT layer IN_LIST EPD_LAYERS)
    string(APPEND errors "\n  docs/ARCHITECTURE.md: epd::${layer} is not a layer of cmake/epd_layers.cmake")
    continue()
  endif()
  list(APPEND documented ${layer})
  # `x.h`, or an internal header as `epd/<layer>/internal/x.h` (a path doc_paths_test can follow)
  string(REGEX MATCHALL "`(epd/[a-z0-9_]+/internal/)?[A-Za-z0-9_]+\\.h`" doc_headers "${header_cell}")
  string(REPLACE "`" "" doc_headers "${doc_headers}")
  string(REGEX REPLACE "epd/[a-z0-9_]+/internal/" "internal/" doc_headers "${doc_headers}")
  set(want ${EPD_LAYER_${layer}_HEADERS})
  list(SORT doc_headers)
  list(SORT want)
  if(NOT "${doc_headers}" STREQUAL "${want}")
    string(APPEND errors "\n  docs/ARCHITECTURE.md lists for ${layer}: '${doc_headers}'; "
                         "cmake/epd_layers.cmake: '${want}'")
  endif()
endforeach()
foreach(layer ${EPD_LAYERS})
  if(NOT layer IN_LIST documented)
    string(APPEND errors "\n  docs/ARCHITECTURE.md's layer table has no row for ${layer}")
  endif()
endforeach()

if(errors)
  message(FATAL_ERROR "Layering:${errors}")
endif()
message(STATUS "layering: ${EPD_LAYERS} match their includes and docs/ARCHITECTURE.md")
