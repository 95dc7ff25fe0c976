# CMake toolchain file: cross-compiles Kestrel for 64-bit ARM Linux (aarch64: Jetson Orin,
# Raspberry Pi 4/5, Graviton) with Debian's cross compiler (g++-aarch64-linux-gnu), against the
# target's libraries installed through Debian multiarch (libhwy-dev:arm64 and the like, under
# /usr/lib/aarch64-linux-gnu). scripts/test-arm64.sh uses it; docs/arm64.md describes the setup.
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# Binaries built with it run on this (x86) machine under qemu-user: CMAKE_CROSSCOMPILING_EMULATOR
# makes ctest and gtest_discover_tests do that by themselves.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(KESTREL_CROSS_TRIPLE aarch64-linux-gnu)

set(CMAKE_C_COMPILER ${KESTREL_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${KESTREL_CROSS_TRIPLE}-g++)
# Multiarch: the target's libraries live in /usr/lib/aarch64-linux-gnu, its headers in /usr/include
# (and /usr/include/aarch64-linux-gnu), which the Debian cross compiler searches by itself; the root
# stays /, and find_library looks only in the lib/aarch64-linux-gnu folders, never at x86 libraries.
set(CMAKE_LIBRARY_ARCHITECTURE ${KESTREL_CROSS_TRIPLE})
# pkg-config: only the target's .pc files (and the architecture-independent ones).
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/${KESTREL_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# Tests run under qemu-user, with the target's dynamic loader and libc from multiarch (libc6:arm64,
# /lib/ld-linux-aarch64.so.1 and /lib/aarch64-linux-gnu), where the other target libraries are.
# Not `-L /usr/aarch64-linux-gnu`: qemu would take the loader from the cross toolchain's copy of
# glibc and libc.so.6 from multiarch, two builds that do not match, and the first
# std::thread hangs (docs/arm64.md).
find_program(KESTREL_QEMU_AARCH64 qemu-aarch64)
if(KESTREL_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${KESTREL_QEMU_AARCH64})
endif()
