# Finds libwebp's decoder library (Debian's libwebp 1.2 installs no CMake config; libwebp's own
# builds do, with the same target name). Defines WebP_FOUND and the imported target WebP::webp.
# Hints: WebP_ROOT, or WebP_INCLUDE_DIR and WebP_LIBRARY.
find_path(WebP_INCLUDE_DIR NAMES webp/decode.h)
find_library(WebP_LIBRARY NAMES webp)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(WebP REQUIRED_VARS WebP_LIBRARY WebP_INCLUDE_DIR)
if(WebP_FOUND AND NOT TARGET WebP::webp)
  add_library(WebP::webp UNKNOWN IMPORTED)
  set_target_properties(WebP::webp PROPERTIES
    IMPORTED_LOCATION "${WebP_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${WebP_INCLUDE_DIR}")
  # A static libwebp uses threads and libm.
  if(WebP_LIBRARY MATCHES "\\.a$")
    find_package(Threads REQUIRED)
    set_property(TARGET WebP::webp PROPERTY INTERFACE_LINK_LIBRARIES Threads::Threads m)
  endif()
endif()
mark_as_advanced(WebP_INCLUDE_DIR WebP_LIBRARY)
