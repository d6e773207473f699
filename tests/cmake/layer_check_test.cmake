cmake_minimum_required(VERSION 3.25)
# ctest layering_link_check_test: configures tests/cmake/layer_violation once
# per rule it breaks and expects epd_check_layers() to fail naming the edge,
# and once breaking none and expects success.
#   cmake -DWORK_DIR=<scratch dir> -P layer_check_test.cmake
if(NOT WORK_DIR)
  message(FATAL_ERROR "pass -DWORK_DIR=<scratch directory>")
endif()
set(src ${CMAKE_CURRENT_LIST_DIR}/layer_violation)

# violation;regex its error must match ("" for none: must succeed)
set(cases
  "none|"
  "core_links_worker|epd_core \\(layer core\\) links epd::worker \\(layer worker\\)"
  "media_links_server|epd_media \\(layer media\\) links epd_server \\(layer server\\)"
  "core_links_heavy|epd_core \\(layer core\\) links /usr/lib/libtorch.so")
set(failures "")
foreach(c ${cases})
  string(REPLACE "|" ";" parts "${c}")
  list(GET parts 0 violation)
  list(LENGTH parts n)
  set(expect "")
  if(n GREATER 1)
    list(GET parts 1 expect)
  endif()
  file(REMOVE_RECURSE ${WORK_DIR}/${violation})
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${src} -B ${WORK_DIR}/${violation} -DEPD_VIOLATION=${violation}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(expect STREQUAL "")
    if(NOT rc EQUAL 0)
      string(APPEND failures "\n${violation}: expected to configure, failed:\n${err}")
    endif()
  elseif(rc EQUAL 0)
    string(APPEND failures "\n${violation}: configured, but the layer check should have failed it")
  elseif(NOT err MATCHES "${expect}")
    string(APPEND failures "\n${violation}: failed without naming the edge (want /${expect}/):\n${err}")
  else()
    message(STATUS "${violation}: refused as expected")
  endif()
endforeach()
if(failures)
  message(FATAL_ERROR "layer check:${failures}")
endif()
