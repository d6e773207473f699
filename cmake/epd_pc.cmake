# Writes epd.pc (pkg-config, epd::core) for the prefix being installed to.
# Run at install time by cmake/epd_install.cmake, which sets EPD_PC_PREFIX,
# EPD_PC_LIBDIR, EPD_PC_INCLUDEDIR (relative), EPD_PC_VERSION and EPD_PC_OUT.
# The core is a static library whose only dependency is the threads library;
# EPD_PC_EXTRA_LIBS (optional) adds link flags, e.g. a sanitizer build's.
set(EPD_PC_EXTRA_LIBS_TEXT "")
foreach(flag IN LISTS EPD_PC_EXTRA_LIBS)
  string(APPEND EPD_PC_EXTRA_LIBS_TEXT " ${flag}")
endforeach()
file(WRITE "${EPD_PC_OUT}" "prefix=${EPD_PC_PREFIX}
libdir=\${prefix}/${EPD_PC_LIBDIR}
includedir=\${prefix}/${EPD_PC_INCLUDEDIR}

Name: epd
Description: epd-encode core: embedding caches and the encode scheduler (C++20)
Version: ${EPD_PC_VERSION}
Cflags: -I\${includedir} -std=c++20
Libs: -L\${libdir} -lepd_core -pthread${EPD_PC_EXTRA_LIBS_TEXT}
")
message(STATUS "Installing: ${EPD_PC_OUT}")
