# Tiny random Qwen-VL checkpoints in Hugging Face layout, written at build time
# by scripts/make_tiny_checkpoint.py (numpy only, fixed seed, no download), and
# the pytest that compares the libtorch checkpoint towers with an independent
# reference on them (tests/python/test_checkpoint_towers.py).
# Included by src/tower/CMakeLists.txt after EPD_TOWER_PYTHON is set.
#
# Target:
#   tiny_checkpoints  (ALL) writes ${CMAKE_BINARY_DIR}/models/tiny-<arch>/
#                     {config.json, preprocessor_config.json, model.safetensors}
#                     for arch in qwen2_vl, qwen2_5_vl, qwen3_vl.
# Variables set here and in the parent scope:
#   EPD_TINY_CHECKPOINTS_DIR                 ${CMAKE_BINARY_DIR}/models
#   EPD_TINY_QWEN2_VL_DIR, EPD_TINY_QWEN2_5_VL_DIR, EPD_TINY_QWEN3_VL_DIR
# Test:
#   checkpoint_tower_tests  pytest; needs the target checkpoint_tower_dump for
#                           its C++-vs-reference half (skipped, with a reason,
#                           when this build defines no such target).

set(EPD_TINY_CHECKPOINTS_DIR ${CMAKE_BINARY_DIR}/models)
set(_epd_ckpt_script ${PROJECT_SOURCE_DIR}/scripts/make_tiny_checkpoint.py)
set(_epd_ckpt_outputs)
foreach(arch qwen2_vl qwen2_5_vl qwen3_vl)
  set(_dir ${EPD_TINY_CHECKPOINTS_DIR}/tiny-${arch})
  string(TOUPPER ${arch} _upper)
  set(EPD_TINY_${_upper}_DIR ${_dir})
  set(EPD_TINY_${_upper}_DIR ${_dir} PARENT_SCOPE)
  add_custom_command(
    OUTPUT ${_dir}/config.json ${_dir}/preprocessor_config.json ${_dir}/model.safetensors
    COMMAND ${EPD_TOWER_PYTHON} ${_epd_ckpt_script} --arch ${arch} --out ${_dir}
    DEPENDS ${_epd_ckpt_script}
    COMMENT "Writing the tiny random ${arch} checkpoint -> models/tiny-${arch}"
    VERBATIM)
  list(APPEND _epd_ckpt_outputs ${_dir}/config.json ${_dir}/preprocessor_config.json ${_dir}/model.safetensors)
endforeach()
add_custom_target(tiny_checkpoints ALL DEPENDS ${_epd_ckpt_outputs})
set(EPD_TINY_CHECKPOINTS_DIR ${EPD_TINY_CHECKPOINTS_DIR} PARENT_SCOPE)

# TARGET_EXISTS is evaluated at generation time, so the tool may be defined
# anywhere in the project, before or after this file.
add_test(NAME checkpoint_tower_tests
  COMMAND ${EPD_TOWER_PYTHON} -m pytest -q -p no:cacheprovider
          ${PROJECT_SOURCE_DIR}/tests/python/test_checkpoint_towers.py
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(checkpoint_tower_tests PROPERTIES
  ENVIRONMENT "EPD_BUILD_DIR=${CMAKE_BINARY_DIR};EPD_WITH_TORCH=ON;EPD_TINY_CHECKPOINTS=${EPD_TINY_CHECKPOINTS_DIR};EPD_CHECKPOINT_TOWER_DUMP=$<$<TARGET_EXISTS:checkpoint_tower_dump>:$<TARGET_FILE:checkpoint_tower_dump>>"
  TIMEOUT 1200)
