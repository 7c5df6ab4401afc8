# Every buildsystem target defined in `dir` and in the directories below it, into `out`: what
# the project-wide settings applied after configure (cmake/TestBuildFlags.cmake,
# cmake/Unity.cmake) walk.
function(cozy_targets_under dir out)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirectories DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(subdirectory IN LISTS subdirectories)
    cozy_targets_under("${subdirectory}" below)
    list(APPEND targets ${below})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()
