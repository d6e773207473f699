# epd_add_test(NAME foo_test SOURCES a.cc b.cc LIBS epd::core): a GoogleTest
# executable registered with CTest. Included by the top-level CMakeLists.txt
# and by src/gpu's standalone build (scripts/gpu-check.sh); both provide
# GTest::gtest, GTest::gmock and GTest::gtest_main first. Every test may
# include the test-only headers in src/testing/.
include(GoogleTest)

get_filename_component(_epd_testing_dir ${CMAKE_CURRENT_LIST_DIR}/../src/testing ABSOLUTE)
if(NOT TARGET epd_test_util)
  add_library(epd_test_util INTERFACE)
  target_include_directories(epd_test_util INTERFACE ${_epd_testing_dir})
endif()

function(epd_add_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LIBS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  # A test's sources are compiled one by one even in a unity build
  # (EPD_UNITY_BUILD): each test file keeps its own file-local fixtures and
  # constants, and a test is never on `make demo`'s path.
  set_target_properties(${T_NAME} PROPERTIES UNITY_BUILD OFF)
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} epd_test_util GTest::gtest GTest::gmock GTest::gtest_main)
  # Listing the tests runs the binary at build time: a sanitizer build that
  # links libtorch takes tens of seconds to start on a loaded machine.
  if(EPD_ASAN OR EPD_TSAN)
    gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 600)
  else()
    gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60)
  endif()
endfunction()
