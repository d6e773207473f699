# Defines epd_checkpoint_tower (alias epd::checkpoint_tower): the Qwen2-VL /
# Qwen2.5-VL / Qwen3-VL towers from Hugging Face checkpoints, and LoadModel
# (directory -> checkpoint, file -> TorchScript). Shared by
# src/tower/CMakeLists.txt (the normal build) and src/gpu/standalone.cmake
# (the device machine's build), which each provide epd::model,
# epd::torch_tower (library.cmake) and TORCH_LIBRARIES first. Torch headers
# stay private to checkpoint_tower.cc (one translation unit for the three
# towers). Paths are absolute because add_library resolves relative ones
# against the including directory, not this file's.
add_library(epd_checkpoint_tower ${CMAKE_CURRENT_LIST_DIR}/checkpoint_tower.cc
            ${CMAKE_CURRENT_LIST_DIR}/model_loader.cc)
add_library(epd::checkpoint_tower ALIAS epd_checkpoint_tower)
target_link_libraries(epd_checkpoint_tower PUBLIC epd::model epd::torch_tower PRIVATE ${TORCH_LIBRARIES})
