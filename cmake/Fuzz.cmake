# cozy_add_fuzz_target(NAME SOURCE CORPUS_DIR LIBS...)
#
# Every fuzz target is built twice from one source that defines LLVMFuzzerTestOneInput:
#  - always, as NAME_replay: a plain program (any compiler, sanitizers as configured) that runs
#    every file of CORPUS_DIR through the target; registered as a ctest, so the seeds and every
#    crash once found and added to the corpus stay tested;
#  - with COZY_FUZZ=ON (clang), as NAME with -fsanitize=fuzzer in <build>/fuzz/bin, part of the
#    `fuzz_targets` target: scripts/test.sh --fuzz SECONDS runs each on its corpus.
if(COZY_FUZZ AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "COZY_FUZZ=ON needs clang (libFuzzer): configure with "
                      "-DCMAKE_CXX_COMPILER=clang++")
endif()
if(COZY_FUZZ AND NOT TARGET fuzz_targets)
  add_custom_target(fuzz_targets)
endif()

function(cozy_add_fuzz_target name source corpus)
  set(libs ${ARGN})
  add_executable(${name}_replay ${source} ${PROJECT_SOURCE_DIR}/test/fuzz/replay_main.cpp)
  target_link_libraries(${name}_replay PRIVATE cozy_flags ${libs})
  if(BUILD_TESTING)
    add_test(NAME ${name}_corpus COMMAND ${name}_replay ${corpus})
  endif()
  if(COZY_FUZZ)
    add_executable(${name} ${source})
    target_link_options(${name} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(${name} PRIVATE cozy_flags ${libs})
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz/bin)
    add_dependencies(fuzz_targets ${name})
  endif()
endfunction()
