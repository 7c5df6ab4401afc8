# cozy_grpc_library(TARGET PROTO...): a static library of the C++ messages and gRPC stubs of
# each PROTO (a path relative to the current source directory), generated at build time with
# Debian's protoc and grpc_cpp_plugin; nothing generated is checked in. A source includes
# "<its directory under the project>/<name>.pb.h" (.grpc.pb.h for the stubs).
#
# Generated code is not ours to keep warning-clean: no cozy_flags, no warnings, and its include
# dir is SYSTEM so its headers stay quiet inside our own sources. Sanitizer flags still apply so
# ASan sees the objects it instruments the same way.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)

function(cozy_grpc_library target)
  set(generated_dir ${CMAKE_CURRENT_BINARY_DIR}/generated)
  file(RELATIVE_PATH relative_dir ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  set(sources)
  foreach(proto IN LISTS ARGN)
    get_filename_component(name ${proto} NAME_WE)
    get_filename_component(subdirectory ${proto} DIRECTORY)
    set(stem ${generated_dir}/${relative_dir}/${name})
    if(subdirectory)
      set(stem ${generated_dir}/${relative_dir}/${subdirectory}/${name})
    endif()
    set(outputs ${stem}.pb.cc ${stem}.pb.h ${stem}.grpc.pb.cc ${stem}.grpc.pb.h)
    add_custom_command(
      OUTPUT ${outputs}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${generated_dir}
      COMMAND protobuf::protoc
        --proto_path=${PROJECT_SOURCE_DIR}
        --cpp_out=${generated_dir}
        --grpc_out=${generated_dir}
        --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>
        ${CMAKE_CURRENT_SOURCE_DIR}/${proto}
      DEPENDS ${proto} protobuf::protoc gRPC::grpc_cpp_plugin
      COMMENT "protoc: ${relative_dir}/${proto}"
      VERBATIM)
    list(APPEND sources ${stem}.pb.cc ${stem}.grpc.pb.cc)
  endforeach()
  add_library(${target} STATIC ${sources})
  target_compile_options(${target} PRIVATE -w)
  if(COZY_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${COZY_SANITIZE} -fno-omit-frame-pointer)
    target_link_options(${target} PUBLIC -fsanitize=${COZY_SANITIZE})
  endif()
  target_include_directories(${target} SYSTEM PUBLIC ${generated_dir})
  target_link_libraries(${target} PUBLIC gRPC::grpc++ protobuf::libprotobuf)
endfunction()
