# Install and export rules (included at the end of the top-level
# CMakeLists.txt, once every target exists).
#
#   cmake --install build [--prefix DIR]
#
# installs, under the prefix:
#   include/epd/<layer>/*.h         each library's public headers (the layer
#                                   table, cmake/epd_layers.cmake), plus the
#                                   generated epd/core/version.h
#   lib/libepd_*.a                  the libraries (static, position
#                                   independent), exported as epd::core,
#                                   epd::plan, epd::media, epd::video,
#                                   epd::safetensors, epd::model,
#                                   epd::gpu,
#                                   epd::gpu_cuda, epd::torch_tower,
#                                   epd::checkpoint_tower, epd::worker, epd::l3,
#                                   epd::server, epd::client (and the
#                                   internal epd::proto they link)
#   lib/cmake/epd/                  epdConfig.cmake, epdConfigVersion.cmake
#                                   and one epd-<component>-targets.cmake
#                                   per component
#   lib/pkgconfig/epd.pc            epd::core for non-CMake builds
#   bin/epd-encode                  the CLI
#   share/epd/models/*.pt           the default towers (the CLI's default
#                                   --model, found relative to bin/)
#   share/epd/systemd/epd-encode.service   deploy/systemd's example unit
#   EPD_INSTALL_PYTHONDIR/epd/      the Python package (extension, the client
#                                   package epd/client/, gRPC stubs epd/v1/,
#                                   generated _version.py, _service_config.py)
# Only what this build made is installed: a build without gRPC has no
# server component, and so on; epdConfig.cmake knows which.
include(CMakePackageConfigHelpers)

set(EPD_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/epd CACHE STRING
    "Where epdConfig.cmake goes, relative to the install prefix")

# Components in dependency order, each: the component name (also the
# exported target's name, epd::<name>), its target and the components it
# needs. The edges follow the optional ones of the build: epd::core needs
# nothing heavy, epd::server needs gRPC (through proto), and so on; the
# external packages each component needs are found by epdConfig.cmake.in.
set(_epd_components
  "core|epd_core|"
  "plan|epd_plan|core"
  "media|epd_media|core"
  "video|epd_video|media"
  "safetensors|epd_safetensors|core"
  "model|epd_model|core,media,safetensors"
  "gpu|epd_gpu|core"
  "gpu_cuda|epd_gpu_cuda|gpu"
  "torch_tower|epd_torch_tower|core"
  "checkpoint_tower|epd_checkpoint_tower|model,torch_tower"
  "worker|epd_worker|core,media,safetensors"
  "l3|epd_l3|core,media"
  "http|epd_http|core"
  "proto|epd_proto|core,media"
  "server|epd_server|worker,proto,http"
  "openai|epd_openai|server,http,safetensors"
  "client|epd_client|media,proto")

# proto is epd_proto, the layer table's internal "rpc": generated gRPC code
# that the static server and client link, so it is exported (as epd::proto)
# but its one public header is installed with them.

set(EPD_INSTALLED_COMPONENTS "")
set(EPD_COMPONENT_DEPS "")
foreach(entry ${_epd_components})
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 component)
  list(GET parts 1 target)
  list(LENGTH parts n)
  if(NOT TARGET ${target})
    continue()
  endif()
  set(deps "")
  if(n GREATER 2)
    list(GET parts 2 deps)
  endif()
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${component})
  install(TARGETS ${target} EXPORT epd-${component}-targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT epd-${component}-targets NAMESPACE epd:: DESTINATION ${EPD_INSTALL_CMAKEDIR}
          FILE epd-${component}-targets.cmake)
  # Each layer's headers go to include/epd/<layer>/, as in the source tree.
  set(layer ${component})
  if(component STREQUAL "proto")
    set(layer none)
  endif()
  set(header_layers ${layer})
  if(component STREQUAL "client" OR component STREQUAL "server")
    list(APPEND header_layers rpc)  # the stats both ends report: installed with either
  endif()
  foreach(l ${header_layers})
    set(headers "")
    foreach(h ${EPD_LAYER_${l}_HEADERS})
      if(EXISTS ${PROJECT_SOURCE_DIR}/include/epd/${l}/${h})
        list(APPEND headers ${PROJECT_SOURCE_DIR}/include/epd/${l}/${h})
      endif()
    endforeach()
    if(l STREQUAL "core")
      list(APPEND headers ${PROJECT_BINARY_DIR}/include/epd/core/version.h)
    endif()
    if(headers)
      install(FILES ${headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/epd/${l})
    endif()
  endforeach()
  list(APPEND EPD_INSTALLED_COMPONENTS ${component})
  string(REPLACE "," ";" deps "${deps}")
  string(APPEND EPD_COMPONENT_DEPS "set(_epd_deps_${component} \"${deps}\")\n")
endforeach()

# --- the package config, its version file and pkg-config ----------------------
configure_package_config_file(cmake/epdConfig.cmake.in ${PROJECT_BINARY_DIR}/epdConfig.cmake
                              INSTALL_DESTINATION ${EPD_INSTALL_CMAKEDIR})
# Same major version: 0.x releases promise no more, so 0.1 accepts only 0.1.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/epdConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/epdConfig.cmake ${PROJECT_BINARY_DIR}/epdConfigVersion.cmake
        DESTINATION ${EPD_INSTALL_CMAKEDIR})

# The .pc file is written for the final prefix at install time
# (cmake/epd_pc.cmake), so `cmake --install --prefix DIR` gets paths in DIR.
install(CODE "
  set(EPD_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  set(EPD_PC_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
  set(EPD_PC_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")
  set(EPD_PC_VERSION \"${PROJECT_VERSION}\")
  set(EPD_PC_EXTRA_LIBS \"${EPD_SANITIZER_LINK_FLAGS}\")
  set(EPD_PC_OUT \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig/epd.pc\")
  include(\"${PROJECT_SOURCE_DIR}/cmake/epd_pc.cmake\")")

# --- the CLI, its default models, the systemd example ----------------------------
if(TARGET epd-encode)
  install(TARGETS epd-encode RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
endif()
# Component "cli": `cmake --install BUILD --component cli` installs the
# program and its models alone, after building only epd-encode and
# default_model (the image's builder stage, deploy/oci/Containerfile); the
# scripted towers are OPTIONAL there, as they need torch in Python.
foreach(model EPD_DEFAULT_TOWER_PATH EPD_DEFAULT_TOWER_NODS_PATH)
  if(${model})
    install(FILES ${${model}} DESTINATION ${CMAKE_INSTALL_DATADIR}/epd/models COMPONENT cli OPTIONAL)
  endif()
endforeach()
# The default model (a Qwen2.5-VL checkpoint directory): the installed
# epd-encode runs share/epd/models/default-qwen2_5_vl when given no --model.
if(EPD_DEFAULT_MODEL_DIR)
  install(DIRECTORY ${EPD_DEFAULT_MODEL_DIR} DESTINATION ${CMAKE_INSTALL_DATADIR}/epd/models COMPONENT cli)
endif()
install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/epd-encode.service
        DESTINATION ${CMAKE_INSTALL_DATADIR}/epd/systemd)

# --- the Python package ------------------------------------------------------------
if(TARGET epd_python_core)
  install(TARGETS epd_python_core LIBRARY DESTINATION ${EPD_INSTALL_PYTHONDIR}/epd)
  # The pure-Python files with their folders (the client package epd/client/)
  # and the generated ones (_version.py, _service_config.py, the gRPC stubs
  # epd/v1/), as the build tree holds them.
  install(DIRECTORY ${CMAKE_BINARY_DIR}/python/epd/ DESTINATION ${EPD_INSTALL_PYTHONDIR}/epd
          FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
endif()
