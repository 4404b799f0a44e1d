# The CUDA backend's tests (label gpu). Each skips, reported as skipped, without a CUDA device.
#   test_cuda_ops       every Ops method against the CPU backend, fp32 and bf16 (op_tolerances.h)
#   test_cuda_training  tiny model on the GPU vs the CPU; offload modes bitwise on the GPU
#   gpu.test_reference  the Transformers fixtures on the GPU (cases of test_reference)
#   gpu.test_memory_plan  offloaded checkpoints, MLP tiles and the planned peak on the GPU
#   gpu.memcheck/racecheck  compute-sanitizer over the quick op cases (our flash attention);
#   gpu.memcheck_cudnn      the same memcheck of the attention cases through cuDNN
# No MPI in this binary (plain gtest main): ~300 cases, each its own process.
so_add_gtest(test_cuda_ops LABELS gpu SOURCES test_cuda_ops.cpp LIBS so_model GTest::gtest_main)  # so_model: RoPE tables
# The attention cases once more under each attention kernel: SO_ATTENTION_KERNEL is read once per
# process, so each variant is its own set of ctest entries with the variable in its environment.
foreach(kernel 1 2)
  so_discover_gpu_tests(test_cuda_ops TEST_PREFIX "attention_kernel${kernel}." TEST_FILTER "*attention*"
                        ENVIRONMENT SO_ATTENTION_KERNEL=${kernel})
endforeach()

# And through cuDNN's fused SDPA, required (cases it cannot take skip with the reason): its
# deterministic backward (MatchesCpu and RunToRunBitwise), and its backward with atomics (MatchesCpu).
so_discover_gpu_tests(test_cuda_ops TEST_PREFIX "attention_cudnn." TEST_FILTER "*attention*"
                      ENVIRONMENT SO_TEST_ATTENTION=cudnn)
so_discover_gpu_tests(test_cuda_ops TEST_PREFIX "attention_cudnn_atomic." TEST_FILTER "*MatchesCpu*attention*"
                      ENVIRONMENT SO_TEST_ATTENTION=cudnn SO_TEST_DETERMINISTIC_ATTENTION=0)

so_add_gtest(test_cuda_training LABELS gpu SOURCES test_cuda_training.cpp)

# so_train on the GPU with steps bracketed for a profiler (cudaProfilerStart/Stop), the measured
# GEMM rate and the attention choice on its start-up lines. Exit 77 (skipped) without a GPU.
add_test(NAME gpu.so_train_profile_steps
         COMMAND bash -c "nvidia-smi -L >/dev/null 2>&1 || { echo 'no GPU: skipped'; exit 77; }; out=$($<TARGET_FILE:so_train> --config configs/runs/tiny-demo.json --set backend.type=cuda --set bf16.enabled=true --steps 3 --set data.seq_len=64 --profile-steps 2:3 2>&1) || { echo \"$out\"; exit 1; }; echo \"$out\"; grep -q 'TFLOP/s measured GEMM' <<<\"$out\" && grep -q 'attention: ' <<<\"$out\" && grep -q '^done: 3 steps' <<<\"$out\" && echo 'profile steps ok'"
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(gpu.so_train_profile_steps PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300
                     PASS_REGULAR_EXPRESSION "profile steps ok")

# Asynchronous saves on the GPU (device buckets read by D2H copies after the saving step's device
# updates, host buckets after the CPU optimizer finishes them) equal synchronous ones bit for bit.
add_test(NAME gpu.async_save_snapshot
         COMMAND bash -c "nvidia-smi -L >/dev/null 2>&1 || { echo 'no GPU: skipped'; exit 77; }; exec \"$0\" \"$@\""
                 ${PROJECT_SOURCE_DIR}/tests/cli/async_save_snapshot.sh $<TARGET_FILE:so_train>
                 ${CMAKE_CURRENT_BINARY_DIR}/async_cuda --set backend.type=cuda --set bf16.enabled=true
                 --set zero_optimization.sub_group_size=100000 --set zero_optimization.offload_optimizer.device=cpu
                 --set zero_optimization.offload_optimizer.super_offload=true
                 --set zero_optimization.offload_optimizer.ratio=0.5
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(gpu.async_save_snapshot PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300
                     PASS_REGULAR_EXPRESSION "async save snapshot: losses and all tensors of both checkpoints identical")

# test_reference's CUDA instantiation as one gpu entry (tests/CMakeLists.txt registers each case of
# the binary under unit, where these skip without a GPU). All its cases skip or none do.
add_test(NAME gpu.test_reference COMMAND $<TARGET_FILE:test_reference> --gtest_filter=TransformersCuda/*
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(gpu.test_reference PROPERTIES LABELS gpu SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]" TIMEOUT 600)

# The memory features and the planner's peak on the GPU (test_memory_plan's Cuda/ cases).
add_test(NAME gpu.test_memory_plan COMMAND $<TARGET_FILE:test_memory_plan> --gtest_filter=Cuda/*
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(gpu.test_memory_plan PROPERTIES LABELS gpu SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]" TIMEOUT 600)

# compute-sanitizer over the Small op cases (memcheck: out-of-bounds, misaligned and uninitialised
# device accesses; racecheck: shared-memory hazards). Exit 77 (skipped) without the tool or a GPU.
# Our flash kernels are what these check (auto would hand bf16 attention to cuDNN, whose kernels
# are not ours to fix); cuDNN's path gets one memcheck entry of its own (its calls into our
# buffers: sizes, alignment, the kept workspace).
foreach(tool memcheck racecheck)
  add_test(NAME gpu.${tool}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/run_sanitizer.sh ${tool} $<TARGET_FILE:test_cuda_ops>
                   "Small/CudaOps.MatchesCpu/*:Ops/CudaBadIds.*"
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(gpu.${tool} PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 1800
                       ENVIRONMENT SO_TEST_ATTENTION=flash)
endforeach()
add_test(NAME gpu.memcheck_cudnn
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/run_sanitizer.sh memcheck $<TARGET_FILE:test_cuda_ops>
                 "Small/CudaOps.MatchesCpu/*attention*"
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(gpu.memcheck_cudnn PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 1800
                     ENVIRONMENT SO_TEST_ATTENTION=cudnn)
