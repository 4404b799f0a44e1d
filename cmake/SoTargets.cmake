# so_add_library(name SOURCES ... DEPS ...): one static library per architecture layer, with the
# project's warnings and the public include directory.
set(SO_WARNINGS -Wall -Wextra -Wno-unused-parameter)
function(so_add_library name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${A_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR})
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${SO_WARNINGS}>)
  target_link_libraries(${name} PUBLIC ${A_DEPS})
endfunction()
