# cozy_add_fuzz_target(NAME SOURCE CORPUS_DIR LIBS...)
#
# Every fuzz target is built twice from one source that defines LLVMFuzzerTestOneInput:
#  - always, as NAME_replay: a plain program (any compiler, sanitizers as configured) that runs
#    every file of CORPUS_DIR through the target; registered as a ctest, so the seeds and every
#    crash once found and added to the corpus stay tested;
#  - with COZY_FUZZ=ON (clang), as NAME with -fsanitize=fuzzer for real fuzzing:
#      build-fuzz/test/fuzz/NAME CORPUS_DIR -max_total_time=60
function(cozy_add_fuzz_target name source corpus)
  set(libs ${ARGN})
  add_executable(${name}_replay ${source} ${PROJECT_SOURCE_DIR}/test/fuzz/replay_main.cpp)
  target_link_libraries(${name}_replay PRIVATE cozy_flags ${libs})
  add_test(NAME ${name}_corpus COMMAND ${name}_replay ${corpus})
  if(COZY_FUZZ)
    add_executable(${name} ${source})
    target_compile_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(${name} PRIVATE cozy_flags ${libs})
  endif()
endfunction()
