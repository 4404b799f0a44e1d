# The project's Python environment (scripts/python_env.sh, made by scripts/install-deps.sh from
# scripts/requirements.txt): the interpreter of every Python test, fixture script and tool, and of
# so_bench's peer processes. python3 on PATH is never used. -DSO_PYTHON=/path/to/bin/python points
# the build at another environment with the modules of scripts/requirements.txt.
if(NOT SO_PYTHON)
  execute_process(COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/python_env.sh path
                  OUTPUT_VARIABLE so_python_env OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
  set(SO_PYTHON ${so_python_env}/bin/python CACHE FILEPATH
      "The project's Python interpreter (scripts/python_env.sh path, or an environment of yours)")
endif()
if(NOT EXISTS ${SO_PYTHON})
  if(SO_BUILD_TESTS)
    message(FATAL_ERROR "so_train: the project's Python interpreter '${SO_PYTHON}' does not exist: run "
                        "scripts/install-deps.sh (it makes the environment), or point the build at an environment "
                        "of yours with -DSO_PYTHON=/path/to/bin/python (it needs scripts/requirements.txt)")
  endif()
  message(STATUS "so_train: no Python environment at '${SO_PYTHON}' (so_bench's peers need it)")
else()
  message(STATUS "so_train: Python ${SO_PYTHON}")
endif()
