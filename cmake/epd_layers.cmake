# The layers of epd-encode: which library each public header belongs to and
# which lower layers each library may use. One table, read by
#   - epd_check_layers()           (the top-level build calls it once every
#     target is defined): fails the configure when a library links an epd
#     library above it, or when epd::core links anything but the C++ runtime
#     and threads;
#   - cmake/epd_install.cmake      which headers each install component
#     carries;
#   - tests/cmake/check_includes.cmake  (ctest layering_includes_test): every
#     header under include/epd/ and every library source includes only
#     headers of its own layer or below, and docs/ARCHITECTURE.md's layer
#     table lists exactly these headers per target.
# docs/ARCHITECTURE.md's "Layers and dependencies" table mirrors it; change
# both together.
#
# Per layer L (in EPD_LAYERS, lowest first):
#   EPD_LAYER_<L>_TARGET   the CMake target (epd_<...>; exported as epd::<L>)
#   EPD_LAYER_<L>_USES     the layers L may include and link (transitively
#                          closed: list every one, not just the next)
#   EPD_LAYER_<L>_HEADERS  its public headers, under include/epd/<L>/ (the
#                          folder is the layer, so an include line names it),
#                          and its internal ones as internal/<name>.h
# "rpc" is the internal epd_proto (generated gRPC code and the conversions);
# its one public header, the stats both ends report, is shared by server and
# client.
set(EPD_LAYERS core plan media video safetensors model gpu gpu_cuda torch_tower checkpoint_tower worker l3 http rpc server openai client python)

set(EPD_LAYER_core_TARGET epd_core)
set(EPD_LAYER_core_USES "")
set(EPD_LAYER_core_HEADERS
  admission_filter.h cache_options.h concurrent_cache.h content_key_type.h embedding.h embedding_cache.h
  encode_scheduler.h encode_types.h grid.h job_scheduler.h mutex.h policy_duel.h
  shared_tier.h stat_fields.h status.h tenant_quota.h thread_annotations.h tiered_cache.h version.h vision_tower.h
  # Internal headers (abseil's convention): installed, since the public
  # templates include them, but not part of the API. A header is listed with
  # its folder under include/epd/<layer>/, and is installed there.
  internal/adaptive_policy.h internal/any_policy.h internal/cache_policy.h internal/entry_slab.h internal/eviction_order.h
  internal/gdsf_heap.h internal/gdsf_policy.h internal/lru_policy.h internal/slot_index.h
  internal/tenant_partition.h)

# Cache economics (docs/PLAN.md): the miss-ratio curves and the planner that
# sizes the tiers from them. Nothing in the serving path uses it.
set(EPD_LAYER_plan_TARGET epd_plan)
set(EPD_LAYER_plan_USES core)
set(EPD_LAYER_plan_HEADERS
  mini_sim.h miss_ratio_curve.h plan.h plan_serve_args.h plan_tiers.h shards.h stack_distance.h)

set(EPD_LAYER_media_TARGET epd_media)
set(EPD_LAYER_media_USES core)
set(EPD_LAYER_media_HEADERS content_key.h image.h preprocess.h tenant_key.h video.h)

# FFmpeg's edge: container decoding (EPD_WITH_VIDEO).
set(EPD_LAYER_video_TARGET epd_video)
set(EPD_LAYER_video_USES core media)
set(EPD_LAYER_video_HEADERS video_decoder.h)

# The safetensors format, once: the checkpoint reader (model) and the
# embedding files (worker) both use it.
set(EPD_LAYER_safetensors_TARGET epd_safetensors)
set(EPD_LAYER_safetensors_USES core)
set(EPD_LAYER_safetensors_HEADERS safetensors_codec.h)

set(EPD_LAYER_model_TARGET epd_model)
set(EPD_LAYER_model_USES core media safetensors)
set(EPD_LAYER_model_HEADERS checkpoint.h safetensors_file.h)

set(EPD_LAYER_gpu_TARGET epd_gpu)
set(EPD_LAYER_gpu_USES core)
set(EPD_LAYER_gpu_HEADERS device.h device_tier.h host_memory_pool.h)

set(EPD_LAYER_gpu_cuda_TARGET epd_gpu_cuda)
set(EPD_LAYER_gpu_cuda_USES core gpu)
set(EPD_LAYER_gpu_cuda_HEADERS cuda_device.h)

set(EPD_LAYER_torch_tower_TARGET epd_torch_tower)
set(EPD_LAYER_torch_tower_USES core)
set(EPD_LAYER_torch_tower_HEADERS torch_tower.h)

set(EPD_LAYER_checkpoint_tower_TARGET epd_checkpoint_tower)
set(EPD_LAYER_checkpoint_tower_USES core media safetensors model torch_tower)
set(EPD_LAYER_checkpoint_tower_HEADERS checkpoint_tower.h)

set(EPD_LAYER_worker_TARGET epd_worker)
set(EPD_LAYER_worker_USES core media safetensors)
set(EPD_LAYER_worker_HEADERS encode_request.h encode_worker.h item_probe.h safetensors.h worker_loop.h worker_options.h)

set(EPD_LAYER_l3_TARGET epd_l3)
set(EPD_LAYER_l3_USES core media)
set(EPD_LAYER_l3_HEADERS l3_keyring.h l3_lease.h l3_mac.h l3_ring.h l3_value.h redis_tier.h)

# The HTTP edge: Boost.Beast (HttpEndpoint) and libcurl (MediaFetcher).
set(EPD_LAYER_http_TARGET epd_http)
set(EPD_LAYER_http_USES core)
set(EPD_LAYER_http_HEADERS http_endpoint.h media_fetch.h)

set(EPD_LAYER_rpc_TARGET epd_proto)
set(EPD_LAYER_rpc_USES core media)
set(EPD_LAYER_rpc_HEADERS server_stats.h)

set(EPD_LAYER_server_TARGET epd_server)
set(EPD_LAYER_server_USES core media safetensors gpu worker rpc http)
set(EPD_LAYER_server_HEADERS front_door.h request_shape.h server.h)

# The OpenAI-compatible front and ECExampleConnector publication (docs/VLLM.md).
set(EPD_LAYER_openai_TARGET epd_openai)
set(EPD_LAYER_openai_USES core media safetensors gpu worker rpc http server)
set(EPD_LAYER_openai_HEADERS ec_publisher.h openai_front.h)

set(EPD_LAYER_client_TARGET epd_client)
set(EPD_LAYER_client_USES core media gpu rpc)
set(EPD_LAYER_client_HEADERS client.h)

set(EPD_LAYER_python_TARGET epd_python_core)
set(EPD_LAYER_python_USES core)
set(EPD_LAYER_python_HEADERS "")

# Includes that break the table today, each "<file>><header>", tolerated by
# the include check until fixed; the check fails on an entry that no longer
# occurs, so each is deleted with its fix.
set(EPD_LAYER_KNOWN_VIOLATIONS "")

# What epd::core may link besides nothing: the threads library (the C++
# runtime needs no entry).
set(EPD_CORE_ALLOWED_LINKS Threads::Threads)

# epd_check_layers(): see the top of this file. Reads LINK_LIBRARIES and
# INTERFACE_LINK_LIBRARIES (a static library's private links show up there
# as $<LINK_ONLY:...>) of every layer's target that exists, and fails with
# one FATAL_ERROR naming every offending edge.
function(epd_check_layers)
  # epd target -> its layer, so a linked name can be placed.
  foreach(layer ${EPD_LAYERS})
    set(_layer_of_${EPD_LAYER_${layer}_TARGET} ${layer})
  endforeach()
  set(errors "")
  foreach(layer ${EPD_LAYERS})
    set(target ${EPD_LAYER_${layer}_TARGET})
    if(NOT TARGET ${target})
      continue()
    endif()
    set(links "")
    foreach(prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
      get_target_property(v ${target} ${prop})
      if(v)
        list(APPEND links ${v})
      endif()
    endforeach()
    list(REMOVE_DUPLICATES links)
    foreach(item ${links})
      # $<LINK_ONLY:x> -> x; any other generator expression is not a target name.
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" item "${item}")
      if(item MATCHES "\\$<")
        continue()
      endif()
      set(name ${item})
      if(TARGET ${item})
        get_target_property(aliased ${item} ALIASED_TARGET)
        if(aliased)
          set(name ${aliased})
        endif()
      endif()
      if(DEFINED _layer_of_${name})
        set(dep_layer ${_layer_of_${name}})
        if(NOT dep_layer IN_LIST EPD_LAYER_${layer}_USES)
          string(APPEND errors "\n  ${target} (layer ${layer}) links ${item} (layer ${dep_layer}), which "
                               "${layer} may not use (it may use: ${EPD_LAYER_${layer}_USES})")
        endif()
      elseif(name MATCHES "^epd_")
        string(APPEND errors "\n  ${target} (layer ${layer}) links ${item}, an epd target in no layer")
      elseif(layer STREQUAL "core" AND NOT item IN_LIST EPD_CORE_ALLOWED_LINKS)
        string(APPEND errors "\n  ${target} (layer core) links ${item}: the core links nothing but "
                             "${EPD_CORE_ALLOWED_LINKS}")
      endif()
    endforeach()
  endforeach()
  if(errors)
    message(FATAL_ERROR "Layering (cmake/epd_layers.cmake, docs/ARCHITECTURE.md):${errors}")
  endif()
endfunction()
