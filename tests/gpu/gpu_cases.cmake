# so_discover_gpu_tests(target [TEST_PREFIX p] [TEST_FILTER f] [ENVIRONMENT e]): the gpu-labelled
# cases of a gtest binary. Which entries ctest gets is decided when ctest reads the test list, not
# at configure time (the build machine has no GPU; the GPU machine runs the packed build):
#   with a GPU      each case its own entry (gtest_discover_tests), as a GPU run wants them;
#   without one     one entry, gpu_cases.<target>[.<prefix>], that runs the selection in one
#                   process and is skipped if the cases skipped, fails if one failed or the binary
#                   crashed (tests/gpu/gpu_cases_without_gpu.sh): what 1,700 per-case processes
#                   that each load the CUDA libraries only to skip showed, in about a second.
# SO_TEST_GPU_CASES=each or =binary in ctest's environment overrides the detection (each: list or
# run the per-case names on a machine without a GPU, as jobs/local/gpu_pack.sh does).
set(SO_GPU_CASES_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/gpu_cases_without_gpu.sh)

function(so_discover_gpu_tests target)
  cmake_parse_arguments(A "" "TEST_PREFIX;TEST_FILTER" "ENVIRONMENT" ${ARGN})
  # The environment is set on the discovered cases below, not through PROPERTIES: gtest_discover_tests
  # splits a list value there, and every variable after the first was lost.
  set(discover WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} DISCOVERY_TIMEOUT 60 TEST_LIST so_gpu_cases_list
               PROPERTIES LABELS gpu TIMEOUT 600)
  if(A_TEST_PREFIX)
    list(APPEND discover TEST_PREFIX "${A_TEST_PREFIX}")
  endif()
  if(A_TEST_FILTER)
    list(APPEND discover TEST_FILTER "${A_TEST_FILTER}")
  endif()
  gtest_discover_tests(${target} ${discover})
  # gtest_discover_tests appended the file that registers the cases; it is now included only
  # when the cases are wanted one by one.
  get_property(includes DIRECTORY PROPERTY TEST_INCLUDE_FILES)
  list(POP_BACK includes per_case)
  set_property(DIRECTORY PROPERTY TEST_INCLUDE_FILES ${includes})

  string(REGEX REPLACE "\\.$" "" prefix "${A_TEST_PREFIX}")
  set(name gpu_cases.${target})
  if(prefix)
    string(APPEND name .${prefix})
  endif()
  set(filter "${A_TEST_FILTER}")
  if(NOT filter)
    set(filter "*")
  endif()
  set(environment "")
  set(case_environment "")
  if(A_ENVIRONMENT)
    set(environment " ENVIRONMENT [==[${A_ENVIRONMENT}]==]")
    set(case_environment "
  if(so_gpu_cases_list)
    set_tests_properties(\${so_gpu_cases_list} PROPERTIES${environment})
  endif()")
  endif()
  set(wrapper ${CMAKE_CURRENT_BINARY_DIR}/${name}.cmake)
  file(GENERATE OUTPUT ${wrapper} CONTENT "\
# ${name}: ${target}'s gpu cases (${filter}), one entry per case with a GPU, one in all without.
if(NOT DEFINED so_gpu_cases)
  set(so_gpu_cases \"\$ENV{SO_TEST_GPU_CASES}\")
  if(so_gpu_cases STREQUAL \"\")
    file(GLOB so_gpu_devices /dev/nvidia[0-9]*)
    execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE so_smi OUTPUT_QUIET ERROR_QUIET)
    if(so_gpu_devices OR so_smi EQUAL 0)
      set(so_gpu_cases each)
    else()
      set(so_gpu_cases binary)
    endif()
  elseif(NOT so_gpu_cases MATCHES \"^(each|binary)$\")
    message(FATAL_ERROR \"SO_TEST_GPU_CASES is '\${so_gpu_cases}'; choose each or binary\")
  endif()
endif()
if(so_gpu_cases STREQUAL each)
  unset(so_gpu_cases_list)
  include([==[${per_case}]==])${case_environment}
else()
  add_test([==[${name}]==] [==[${SO_GPU_CASES_SCRIPT}]==] [==[$<TARGET_FILE:${target}>]==] [==[${filter}]==])
  set_tests_properties([==[${name}]==] PROPERTIES WORKING_DIRECTORY [==[${PROJECT_SOURCE_DIR}]==]
                       LABELS gpu TIMEOUT 600 SKIP_RETURN_CODE 77${environment})
endif()
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${wrapper})
endfunction()
