# The fine-tuning data path (docs/finetuning.md): preparation, reading, loss normalisation. Label
# `torch`: so_train against a PyTorch loop run live (the sanitizer tree leaves these to the main tree).
add_test(NAME data.prepare_vs_transformers
         COMMAND ${SO_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/test_prepare_data.py ${CMAKE_CURRENT_BINARY_DIR}/data_prepare)
set_tests_properties(data.prepare_vs_transformers PROPERTIES LABELS unit PASS_REGULAR_EXPRESSION "all checks passed"
                     TIMEOUT 300)
# so_train on a masked, padded prepared dataset against a torch loop fed the same batches: step 1
# to 1e-6, 10 steps to 1e-4; the loss over the step's supervised tokens and per micro-batch; dp2.
foreach(norm step micro_batch)
  add_test(NAME data.masked_training_vs_torch_${norm}
           COMMAND ${SO_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/check_masked_training.py
                   ${CMAKE_CURRENT_BINARY_DIR}/data_masked_${norm} $<TARGET_FILE:so_train> --normalization ${norm})
  set_tests_properties(data.masked_training_vs_torch_${norm} PROPERTIES LABELS "unit;torch"
                       PASS_REGULAR_EXPRESSION "masked training matches torch" TIMEOUT 300)
  add_test(NAME mpi.masked_training_vs_torch_${norm}_np2
           COMMAND ${SO_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/check_masked_training.py
                   ${CMAKE_CURRENT_BINARY_DIR}/data_masked_${norm}_np2 $<TARGET_FILE:so_train> --normalization ${norm}
                   --mpiexec ${MPIEXEC_BIN} --np 2)
  set_tests_properties(mpi.masked_training_vs_torch_${norm}_np2 PROPERTIES LABELS "mpi;torch" ENVIRONMENT "${SO_MPI_TEST_ENV}"
                       PASS_REGULAR_EXPRESSION "masked training matches torch" TIMEOUT 300)
endforeach()
# Resume mid-epoch bit for bit, epochs, validation loss vs transformers, steps without a supervised token, and the refusals.
add_test(NAME data.prepared_runs COMMAND ${SO_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/check_prepared_runs.py
                                         ${CMAKE_CURRENT_BINARY_DIR}/data_prepared_runs $<TARGET_FILE:so_train>
                                         $<TARGET_FILE:so_ckpt>)
set_tests_properties(data.prepared_runs PROPERTIES LABELS unit PASS_REGULAR_EXPRESSION "all checks passed" TIMEOUT 300)
add_test(NAME mpi.prepared_eval_zero3_np2
         COMMAND ${SO_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/check_prepared_runs.py
                 ${CMAKE_CURRENT_BINARY_DIR}/data_prepared_eval_np2 $<TARGET_FILE:so_train> $<TARGET_FILE:so_ckpt> ${MPIEXEC_BIN})
set_tests_properties(mpi.prepared_eval_zero3_np2 PROPERTIES LABELS mpi ENVIRONMENT "${SO_MPI_TEST_ENV}"
                     PASS_REGULAR_EXPRESSION "all checks passed" TIMEOUT 300)
# The fine-tuning command on its shipped demo, end to end.
add_test(NAME jobs.finetune_demo COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/data/check_finetune_demo.sh
                                         ${CMAKE_CURRENT_BINARY_DIR}/finetune_demo WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(jobs.finetune_demo PROPERTIES LABELS unit PASS_REGULAR_EXPRESSION "finetune demo ok" TIMEOUT 300
                     ENVIRONMENT "SO_TRAIN=$<TARGET_FILE:so_train>;SO_CKPT=$<TARGET_FILE:so_ckpt>;SO_PYTHON=${SO_PYTHON}")
# Megatron-LM .bin/.idx (fixtures by make_megatron_fixture.py), windows with documents, blends,
# damaged index files; loss scales.
so_add_gtest(test_data_path LABELS unit SOURCES data/test_data_path.cpp)
add_test(NAME cli.megatron_blend_trains
         COMMAND $<TARGET_FILE:so_train> --config configs/runs/tiny-demo.json --steps 2 --set data.seq_len=32
                 --set "data={\"type\": \"megatron\", \"seq_len\": 32, \"blend\": [1, \"tests/data/fixtures/megatron_i32_sentences\", 3, \"tests/data/fixtures/megatron_i32_sentences\"]}"
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.megatron_blend_trains PROPERTIES LABELS unit
                     PASS_REGULAR_EXPRESSION "data blend of Megatron indexed dataset .*done: 2 steps")
so_add_cli_failure(megatron_prefix_missing "names the prefix 'nowhere', but 'nowhere.bin' is not a file"
                   --config configs/runs/tiny-demo.json --steps 1 --set "data={\"type\": \"megatron\", \"seq_len\": 32, \"path\": \"nowhere\"}")
so_add_cli_failure(eval_every_without_validation "train.eval_every is 2 but .* has no validation split to evaluate on"
                   --config configs/runs/tiny-demo.json --steps 1 --set data.seq_len=32 --set train.eval_every=2)
# Packed rows (several documents each, prompts masked) against the same documents run one by one in
# torch: equal only once attention honours TokenBatch::doc_start.
add_test(NAME data.packed_training_vs_torch
         COMMAND ${SO_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/check_masked_training.py
                 ${CMAKE_CURRENT_BINARY_DIR}/data_packed $<TARGET_FILE:so_train> --packed)
set_tests_properties(data.packed_training_vs_torch PROPERTIES LABELS "unit;torch"
                     PASS_REGULAR_EXPRESSION "masked training matches torch" TIMEOUT 300)
add_test(NAME mpi.packed_training_vs_torch_np2
         COMMAND ${SO_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/check_masked_training.py
                 ${CMAKE_CURRENT_BINARY_DIR}/data_packed_np2 $<TARGET_FILE:so_train> --packed --mpiexec ${MPIEXEC_BIN} --np 2)
set_tests_properties(mpi.packed_training_vs_torch_np2 PROPERTIES LABELS "mpi;torch" ENVIRONMENT "${SO_MPI_TEST_ENV}"
                     PASS_REGULAR_EXPRESSION "masked training matches torch" TIMEOUT 300)
# The public example's rows (--example-compatible: padded, everything supervised) against
# transformers with the padding as attention_mask = 0, on one rank and under Ulysses.
add_test(NAME data.example_training_vs_torch
         COMMAND ${SO_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/check_masked_training.py
                 ${CMAKE_CURRENT_BINARY_DIR}/data_example $<TARGET_FILE:so_train> --example-compatible)
set_tests_properties(data.example_training_vs_torch PROPERTIES LABELS "unit;torch"
                     PASS_REGULAR_EXPRESSION "masked training matches torch" TIMEOUT 300)
# The same under Ulysses: two ranks each holding half of every row (whole-row document starts).
foreach(kind masked packed example)
  set(extra "")
  if(kind STREQUAL "packed")
    set(extra --packed)
  elseif(kind STREQUAL "example")
    set(extra --example-compatible)
  endif()
  add_test(NAME mpi.${kind}_training_vs_torch_sp2
           COMMAND ${SO_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/check_masked_training.py
                   ${CMAKE_CURRENT_BINARY_DIR}/data_${kind}_sp2 $<TARGET_FILE:so_train> ${extra}
                   --mpiexec ${MPIEXEC_BIN} --np 2 --sp 2)
  set_tests_properties(mpi.${kind}_training_vs_torch_sp2 PROPERTIES LABELS "mpi;torch" ENVIRONMENT "${SO_MPI_TEST_ENV}"
                       PASS_REGULAR_EXPRESSION "masked training matches torch" TIMEOUT 300)
endforeach()
