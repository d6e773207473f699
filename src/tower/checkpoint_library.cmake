# Defines epd_checkpoint_tower (alias epd::checkpoint_tower): the Qwen2-VL /
# Qwen2.5-VL / Qwen3-VL towers from Hugging Face checkpoints, and LoadModel
# (directory -> checkpoint, file -> TorchScript). Shared by
# src/tower/CMakeLists.txt (the normal build) and src/gpu/standalone.cmake
# (the device machine's build), which each provide epd::model,
# epd::torch_tower (library.cmake) and TORCH_LIBRARIES first. Torch headers
# stay private to the tower's own translation units: checkpoint_tower.cc
# (the per-model glue), tower_forward.cc (the forward), tower_ops.cc (the
# fused steps and the attention adapter) and, in CUDA builds,
# tower_graphs.cc; forward_layout.cc and tower_kernels.cu include no torch.
# Paths are absolute because add_library resolves relative ones against the
# including directory, not this file's.
#
# CUDA tower (EPD_TOWER_CUDA=1): with EPD_WITH_CUDA (nvcc) and a libtorch
# built with CUDA (TORCH_CUDA_LIBRARIES set by its TorchConfig.cmake), the
# fused kernels (tower_kernels.cu) and the CUDA graphs (tower_graphs.cc) are
# compiled in. With EPD_WITH_CUDA and a CPU-only libtorch (Debian's), the
# kernels are still compiled by nvcc (target tower_cuda_kernels, part of ALL)
# so that a CPU machine checks they build; nothing links them.
set(_epd_ckpt_dir ${CMAKE_CURRENT_LIST_DIR})
add_library(epd_checkpoint_tower
  ${_epd_ckpt_dir}/checkpoint_tower.cc
  ${_epd_ckpt_dir}/forward_layout.cc
  ${_epd_ckpt_dir}/model_loader.cc
  ${_epd_ckpt_dir}/tower_forward.cc
  ${_epd_ckpt_dir}/tower_ops.cc)
add_library(epd::checkpoint_tower ALIAS epd_checkpoint_tower)
target_link_libraries(epd_checkpoint_tower PUBLIC epd::model epd::torch_tower PRIVATE ${TORCH_LIBRARIES})

set(EPD_TOWER_CUDA OFF)
if(EPD_WITH_CUDA AND (TORCH_CUDA_LIBRARIES OR TARGET torch_cuda))
  set(EPD_TOWER_CUDA ON)
  target_sources(epd_checkpoint_tower PRIVATE ${_epd_ckpt_dir}/tower_kernels.cu ${_epd_ckpt_dir}/tower_graphs.cc)
  target_compile_definitions(epd_checkpoint_tower PRIVATE EPD_TOWER_CUDA=1)
  target_link_libraries(epd_checkpoint_tower PRIVATE CUDA::cudart)
  # As epd_gpu_cuda (src/gpu/library.cmake): enable_cuda.cmake passes
  # -std=c++20 itself, which CMake 3.25 cannot require of nvcc 13.
  set_target_properties(epd_checkpoint_tower PROPERTIES CUDA_STANDARD_REQUIRED OFF)
elseif(EPD_WITH_CUDA)
  add_library(tower_cuda_kernels OBJECT ${_epd_ckpt_dir}/tower_kernels.cu)
  set_target_properties(tower_cuda_kernels PROPERTIES CUDA_STANDARD_REQUIRED OFF)
endif()
