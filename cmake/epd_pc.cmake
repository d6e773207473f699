# Writes epd.pc (pkg-config, epd::core) for the prefix being installed to.
# Run at install time by cmake/epd_install.cmake, which sets EPD_PC_PREFIX,
# EPD_PC_LIBDIR, EPD_PC_INCLUDEDIR (relative), EPD_PC_VERSION and EPD_PC_OUT.
# The core is a static library whose only dependency is the threads library.
file(WRITE "${EPD_PC_OUT}" "prefix=${EPD_PC_PREFIX}
libdir=\${prefix}/${EPD_PC_LIBDIR}
includedir=\${prefix}/${EPD_PC_INCLUDEDIR}

Name: epd
Description: epd-encode core: embedding caches and the encode scheduler (C++20)
Version: ${EPD_PC_VERSION}
Cflags: -I\${includedir} -std=c++20
Libs: -L\${libdir} -lepd_core -pthread
")
message(STATUS "Installing: ${EPD_PC_OUT}")
