# Test programs are compiled with little optimisation and line tables only (-O1 -g1) in
# optimised builds. They are most of the build's time: nlohmann_json and googletest templates
# at -O2 with full debug info cost about three times as much (a 59 s test file takes 23 s),
# while what they test (the libraries, the programs, the fakes and the benchmarks) keeps the
# build type's flags. Line tables still name the file and line of a failure. docs/testing.md,
# "Build time".
include(${CMAKE_CURRENT_LIST_DIR}/Targets.cmake)

function(cozy_test_build_flags dir)
  cozy_targets_under("${dir}" targets)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(NOT type STREQUAL "EXECUTABLE")
      continue()
    endif()
    get_target_property(libraries ${target} LINK_LIBRARIES)
    if(libraries MATCHES "GTest::")
      target_compile_options(${target} PRIVATE $<$<CONFIG:RelWithDebInfo,Release>:-O1 -g1>)
    endif()
  endforeach()
endfunction()
