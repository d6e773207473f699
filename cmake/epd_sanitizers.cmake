# Sanitizer builds (docs/SANITIZERS.md). Included by the top-level
# CMakeLists.txt before any directory, so every target and every test sees it.
#
# EPD_ASAN: AddressSanitizer + UndefinedBehaviorSanitizer over the whole
# project (`make asan` builds it in build-asan/ and runs the whole ctest suite).
# EPD_TSAN: ThreadSanitizer (`make tsan`, build-tsan/).
#
# The tests that run a Python interpreter (add_test with a python COMMAND)
# load our ASan-instrumented module, or start our instrumented CLI, from an
# uninstrumented /usr/bin/python3. The ASan runtime must be the first library
# in such a process, so under EPD_ASAN each of those tests gets
#   LD_PRELOAD=<gcc's libasan.so> <libstdc++.so>   (libubsan comes in as
#                                    the module's DT_NEEDED; it need not be first)
#   ASAN_OPTIONS=...                (see EPD_ASAN_PYTHON_OPTIONS below)
# through ENVIRONMENT_MODIFICATION, which ctest applies after a test's own
# ENVIRONMENT, so the directories that register Python tests need not know.
option(EPD_ASAN "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
option(EPD_TSAN "Build with ThreadSanitizer" OFF)

if(EPD_ASAN AND EPD_TSAN)
  message(FATAL_ERROR "EPD_ASAN and EPD_TSAN cannot be combined (use two build directories)")
endif()

# The link flags an instrumented library needs in whoever links it (empty
# without a sanitizer); see epd_sanitizer_propagate.
set(EPD_SANITIZER_LINK_FLAGS "")

if(EPD_ASAN)
  set(EPD_SANITIZER_LINK_FLAGS -fsanitize=address,undefined)
  # -fno-sanitize-recover=all: the first UBSan report aborts the process, so
  # a report fails its test instead of scrolling past in the log.
  # -O1 -g1: line numbers in the reports at a bearable compile time
  # (the torch translation units dominate it).
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer -O1 -g1)
  add_link_options(${EPD_SANITIZER_LINK_FLAGS})

  # The compiler's own runtimes, by path. libstdc++ is preloaded right after
  # libasan: ASan looks up the real __cxa_throw when it starts, and
  # /usr/bin/python3 does not link libstdc++, so without it the module's first
  # C++ exception (e.g. a ValueError translated from epd::Error) stops the
  # process with "CHECK failed: ... real___cxa_throw".
  set(EPD_ASAN_PRELOAD "")
  foreach(_lib libasan libstdc++)
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${_lib}.so
                    OUTPUT_VARIABLE _path OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT IS_ABSOLUTE "${_path}" OR NOT EXISTS "${_path}")
      message(FATAL_ERROR "EPD_ASAN: ${CMAKE_CXX_COMPILER} -print-file-name=${_lib}.so gave '${_path}'; "
                          "install the compiler's ${_lib} (Debian: libgcc-12-dev, libstdc++-12-dev)")
    endif()
    list(APPEND EPD_ASAN_PRELOAD ${_path})
  endforeach()
  list(JOIN EPD_ASAN_PRELOAD " " EPD_ASAN_PRELOAD)

  # Options for the Python processes (and every child they start, e.g. the
  # epd-encode server in the client tests):
  # - detect_leaks=0: CPython does not free its interned objects and module
  #   state at exit, and libtorch keeps its allocator caches; LeakSanitizer
  #   would report those at every exit. The C++ tests keep leak detection.
  # libtorch, numpy and PIL are not instrumented, but with the preload they
  # allocate through ASan's malloc like everything else; no other option was
  # needed for them (docs/SANITIZERS.md).
  set(EPD_ASAN_PYTHON_OPTIONS "detect_leaks=0" CACHE STRING
      "ASAN_OPTIONS for the ctest tests that run a Python interpreter under EPD_ASAN")

  # Wraps the builtin add_test: a test whose command is a Python interpreter
  # gets the preload. Arguments are passed on one by one (bracket-quoted), so
  # an argument that is itself a list (install_test's header list) stays one.
  function(add_test)
    set(_args "")
    math(EXPR _last "${ARGC} - 1")
    foreach(_i RANGE 0 ${_last})
      string(APPEND _args " [==[${ARGV${_i}}]==]")
    endforeach()
    cmake_language(EVAL CODE "_add_test(${_args})")
    if(ARGC GREATER 3 AND ARGV0 STREQUAL "NAME" AND ARGV2 STREQUAL "COMMAND")
      get_filename_component(_exe "${ARGV3}" NAME)
      if(_exe MATCHES "^python")
        set_property(TEST ${ARGV1} APPEND PROPERTY ENVIRONMENT_MODIFICATION
                     "LD_PRELOAD=set:${EPD_ASAN_PRELOAD}"
                     "ASAN_OPTIONS=set:${EPD_ASAN_PYTHON_OPTIONS}"
                     "UBSAN_OPTIONS=set:print_stacktrace=1")
      endif()
    endif()
  endfunction()
endif()

if(EPD_TSAN)
  set(EPD_SANITIZER_LINK_FLAGS -fsanitize=thread)
  add_compile_options(-fsanitize=thread -O1 -g1)
  add_link_options(${EPD_SANITIZER_LINK_FLAGS})
endif()

# How many times longer a test may run here than in the plain build: ASan
# and TSan slow a program several times over, more on a loaded machine
# (docs/SANITIZERS.md, "Deadlines"). epd_scale_test_timeout(<test> <seconds>)
# gives a test whose ctest TIMEOUT is a budget for its work (not a bound on a
# hang) that many seconds times the factor, and passes the factor on as
# $EPD_TEST_TIME_FACTOR for the deadlines inside the test. 1 in the plain
# build, so its tests check what they always did.
if(EPD_TSAN)
  set(_epd_time_factor 10)
elseif(EPD_ASAN)
  set(_epd_time_factor 4)
else()
  set(_epd_time_factor 1)
endif()
set(EPD_TEST_TIME_FACTOR ${_epd_time_factor} CACHE STRING
    "How many times longer a test may take than in the plain build (sanitizers)")
function(epd_scale_test_timeout test seconds)
  math(EXPR _timeout "${seconds} * ${EPD_TEST_TIME_FACTOR}")
  set_tests_properties(${test} PROPERTIES TIMEOUT ${_timeout})
  set_property(TEST ${test} APPEND PROPERTY ENVIRONMENT "EPD_TEST_TIME_FACTOR=${EPD_TEST_TIME_FACTOR}")
endfunction()

# An instrumented static library calls into its sanitizer's runtime, so a
# program that links the installed copy must link that runtime too: the
# exported target carries the flags (the build tree has them globally), and
# epd.pc's Libs gets them (cmake/epd_install.cmake).
function(epd_sanitizer_propagate target)
  if(EPD_SANITIZER_LINK_FLAGS)
    target_link_options(${target} INTERFACE $<INSTALL_INTERFACE:${EPD_SANITIZER_LINK_FLAGS}>)
  endif()
endfunction()
