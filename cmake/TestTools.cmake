# Tools and libraries the test suite needs. Missing one leaves tests out (not registered, or
# skipped when they run), so outside CI that is a warning naming what goes untested, and under
# CI (the environment variable CI set to "true" or "1" when configuring) it is a configure error:
# CI must not go green on a suite that quietly left tests out (docs/testing.md, "Skips").

string(TOLOWER "$ENV{CI}" COZY_CI_VALUE)
if(COZY_CI_VALUE STREQUAL "true" OR COZY_CI_VALUE STREQUAL "1")
  set(COZY_CI ON)
else()
  set(COZY_CI OFF)
endif()

# cozy_test_requirement_missing(WHAT WHY): what is missing and which tests it leaves out.
function(cozy_test_requirement_missing what why)
  if(COZY_CI)
    message(FATAL_ERROR "${what} not found: ${why}. Under CI=$ENV{CI} every test must run; "
                        "scripts/install-deps.sh installs it.")
  endif()
  message(WARNING "${what} not found: ${why} (scripts/install-deps.sh installs it)")
endfunction()

# cozy_find_test_tool(VAR PROGRAM WHY): find_program, and the above when it is missing.
function(cozy_find_test_tool var program why)
  find_program(${var} ${program})
  if(NOT ${var})
    cozy_test_requirement_missing("${program}" "${why}")
  endif()
endfunction()
