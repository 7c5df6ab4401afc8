# Project-wide compile flags: warnings (as errors in CI) and optional sanitizers.
add_library(cozy_flags INTERFACE)
target_compile_options(cozy_flags INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion -Wnon-virtual-dtor
  -Wold-style-cast -Wcast-align -Wunused -Woverloaded-virtual
  -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough)
if(COZY_WERROR)
  target_compile_options(cozy_flags INTERFACE -Werror)
endif()
if(COZY_SANITIZE)
  target_compile_options(cozy_flags INTERFACE -fsanitize=${COZY_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  target_link_options(cozy_flags INTERFACE -fsanitize=${COZY_SANITIZE})
endif()
if(COZY_FUZZ)
  # Everything a fuzz target links is instrumented for coverage, with ASan and UBSan.
  target_compile_options(cozy_flags INTERFACE -fsanitize=fuzzer-no-link,address,undefined
                         -fno-omit-frame-pointer)
  target_link_options(cozy_flags INTERFACE -fsanitize=address,undefined)
endif()
