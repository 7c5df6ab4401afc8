# Fuzz targets: one source with LLVMFuzzerTestOneInput, built two ways.
#
# cozy_add_fuzz_target(NAME SOURCE CORPUS_DIR LIBS...)
#   - always (any compiler): NAME_replay, the same source plus a tiny main that feeds it every
#     file of CORPUS_DIR, registered as the ctest NAME_replay. The seed corpus is thereby a
#     regression suite under every build, sanitizers included.
#   - with COZY_FUZZ=ON and clang: NAME, linked with -fsanitize=fuzzer for real fuzzing, e.g.
#     `build/test/fuzz/NAME -max_total_time=60 <scratch-corpus> CORPUS_DIR`.
set(COZY_FUZZ_REPLAY_MAIN ${PROJECT_SOURCE_DIR}/test/fuzz/replay_main.cpp)

if(COZY_FUZZ AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "COZY_FUZZ=ON needs clang (libFuzzer): configure with "
                      "-DCMAKE_CXX_COMPILER=clang++")
endif()

function(cozy_add_fuzz_target NAME SOURCE CORPUS_DIR)
  set(libs ${ARGN})
  add_executable(${NAME}_replay ${SOURCE} ${COZY_FUZZ_REPLAY_MAIN})
  target_link_libraries(${NAME}_replay PRIVATE cozy_flags ${libs})
  if(BUILD_TESTING)
    add_test(NAME ${NAME}_replay COMMAND ${NAME}_replay ${CORPUS_DIR})
  endif()
  if(COZY_FUZZ)
    add_executable(${NAME} ${SOURCE})
    target_compile_options(${NAME} PRIVATE -fsanitize=fuzzer)
    target_link_options(${NAME} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(${NAME} PRIVATE cozy_flags ${libs})
  endif()
endfunction()
