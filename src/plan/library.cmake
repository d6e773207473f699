# Defines epd_plan (alias epd::plan): cache economics, the miss-ratio curves
# (stack distances, SHARDS, MiniSim) and the planner `epd-encode plan` prints
# (docs/PLAN.md). Included by src/plan/CMakeLists.txt, which provides
# epd::core, fmt::fmt and nlohmann_json::nlohmann_json (header-only) first.
# Both stay PRIVATE: the public headers mention neither. Paths are absolute
# because add_library resolves relative ones against the including
# directory, not this file's.
get_filename_component(_epd_plan_root ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
add_library(epd_plan
  ${CMAKE_CURRENT_LIST_DIR}/stack_distance.cc
  ${CMAKE_CURRENT_LIST_DIR}/miss_ratio_curve.cc
  ${CMAKE_CURRENT_LIST_DIR}/shards.cc
  ${CMAKE_CURRENT_LIST_DIR}/mini_sim.cc
  ${CMAKE_CURRENT_LIST_DIR}/plan.cc
  ${CMAKE_CURRENT_LIST_DIR}/plan_tiers.cc
  ${CMAKE_CURRENT_LIST_DIR}/plan_report.cc
  ${CMAKE_CURRENT_LIST_DIR}/plan_serve_args.cc)
add_library(epd::plan ALIAS epd_plan)
target_include_directories(epd_plan PUBLIC $<BUILD_INTERFACE:${_epd_plan_root}/include>
                           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(epd_plan PUBLIC epd::core PRIVATE fmt::fmt nlohmann_json::nlohmann_json)
