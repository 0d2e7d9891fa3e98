# CMake toolchain for the portable wheel (scripts/wheel.sh): Zig's clang targeting glibc 2.28 with
# LLVM's libc++ linked statically. PRESTAGE_ZIG_BIN is the folder of the zcc/zcxx wrappers that
# scripts/wheel.sh writes (CMake takes a compiler as one program, not "zig c++ -target ...").
# Not a cross build (host and target are x86_64 Linux), so configure checks still run programs.
if(NOT DEFINED PRESTAGE_ZIG_BIN)
  set(PRESTAGE_ZIG_BIN "$ENV{PRESTAGE_ZIG_BIN}")
endif()
set(CMAKE_C_COMPILER "${PRESTAGE_ZIG_BIN}/zcc")
set(CMAKE_CXX_COMPILER "${PRESTAGE_ZIG_BIN}/zcxx")
# Zig's linker writes no dependency files.
set(CMAKE_C_LINKER_DEPFILE_SUPPORTED FALSE)
set(CMAKE_CXX_LINKER_DEPFILE_SUPPORTED FALSE)
