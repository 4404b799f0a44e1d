# The fine-tuning data path (docs/finetuning.md): preparation, reading, loss normalisation.
add_test(NAME data.prepare_vs_transformers
         COMMAND ${SO_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/data/test_prepare_data.py ${CMAKE_CURRENT_BINARY_DIR}/data_prepare)
set_tests_properties(data.prepare_vs_transformers PROPERTIES LABELS unit PASS_REGULAR_EXPRESSION "all checks passed"
                     TIMEOUT 300)
