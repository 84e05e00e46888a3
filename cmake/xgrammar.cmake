# xgrammar (https://github.com/mlc-ai/xgrammar, Apache-2.0): grammar-constrained decoding for
# response_format (docs/structured-outputs.md). Neither Debian nor PyPI ships its C++ core as a
# library; its PyPI source distribution (pinned here by version and SHA-256) carries the sources,
# which are built as a static library with this project's compiler flags. Their own CMakeLists
# adds -Werror and -flto=auto to every file, which would tie this build to the warnings of each
# g++ release and to LTO-aware archivers, so it is not used.
include(FetchContent)
set(MOESERVE_XGRAMMAR_VERSION 0.2.9)
FetchContent_Declare(xgrammar_src
  URL https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-${MOESERVE_XGRAMMAR_VERSION}.tar.gz
  URL_HASH SHA256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
  DOWNLOAD_EXTRACT_TIMESTAMP TRUE)
FetchContent_GetProperties(xgrammar_src)
if(NOT xgrammar_src_POPULATED)
  FetchContent_Populate(xgrammar_src)
endif()
file(GLOB_RECURSE xgrammar_sources CONFIGURE_DEPENDS ${xgrammar_src_SOURCE_DIR}/cpp/*.cc)
# The Python (nanobind) and TVM-FFI bindings are not wanted.
list(FILTER xgrammar_sources EXCLUDE REGEX "/cpp/(tvm_ffi|nanobind)/")
add_library(xgrammar STATIC ${xgrammar_sources})
target_compile_features(xgrammar PUBLIC cxx_std_17)
# Optimised even in RelWithDebInfo builds: its mask computation runs once per constrained token.
target_compile_options(xgrammar PRIVATE -O2 -g0 -w)
target_include_directories(xgrammar SYSTEM PUBLIC
  ${xgrammar_src_SOURCE_DIR}/include
  ${xgrammar_src_SOURCE_DIR}/3rdparty/picojson
  ${xgrammar_src_SOURCE_DIR}/3rdparty/dlpack/include)
target_compile_definitions(xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0
                                           XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
target_link_libraries(xgrammar PUBLIC Threads::Threads)
