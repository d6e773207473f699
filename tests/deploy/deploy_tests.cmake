# The ctests of deploy/kubernetes/ and deploy/oci/ (docs/DEPLOY.md), included
# from the top-level CMakeLists.txt. Those of the manifests and the image
# skip (exit 77) with a message naming what is missing where their tools are
# not installed (scripts/install-deps.sh image). `ctest -L deploy` runs all.
add_test(NAME k8s_manifests_test COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/deploy/test_k8s_manifests.py)
set_tests_properties(k8s_manifests_test PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS deploy)
# Packages this build's epd-encode into the image (no second compile), then
# runs it and `podman kube play` of the trial overlay. Serial: podman's
# image builds take both cores of a small machine.
if(TARGET epd-encode)
  # The router script following the encoders as they come and go, with
  # Debian's nginx and two real servers (no container).
  add_test(NAME router_follows_test COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/deploy/test_router_follows.py)
  set_tests_properties(router_follows_test PROPERTIES
    ENVIRONMENT "EPD_ENCODE_BIN=$<TARGET_FILE:epd-encode>;EPD_BUILD_DIR=${CMAKE_BINARY_DIR}"
    TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS deploy)
  # `epd-encode health`, the image's HEALTHCHECK, against a real server.
  add_test(NAME health_command_test COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/deploy/test_health_command.py)
  set_tests_properties(health_command_test PROPERTIES
    ENVIRONMENT "EPD_ENCODE_BIN=$<TARGET_FILE:epd-encode>;EPD_BUILD_DIR=${CMAKE_BINARY_DIR}"
    TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS deploy)
  add_test(NAME oci_k8s_test COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/deploy/test_oci_k8s.py)
  set_tests_properties(oci_k8s_test PROPERTIES
    ENVIRONMENT "EPD_ENCODE_BIN=$<TARGET_FILE:epd-encode>;EPD_BUILD_DIR=${CMAKE_BINARY_DIR}"
    TIMEOUT 1500 RUN_SERIAL TRUE SKIP_RETURN_CODE 77 LABELS "deploy;image")
endif()
