# shellcheck shell=bash
# Sourced (not run) by tests/gpu/device_check.sh and tests/torch/gpu_check.sh: the helpers and
# the tool/dependency discovery that a CUDA build of libhicoll needs on a lent GPU machine,
# where cmake, ninja or nvcc may only exist as pip packages and libfabric, fmt, nlohmann_json
# or pkg-config may be missing (then they come from build-gpu-deps/, tests/gpu/pack_deps.sh).
#
# Expects: START, BUDGET (seconds), ROOT, DEPS (the carried build-gpu-deps), SHIM (a scratch
# directory), CARRIED (1: take the carried dependencies even when the machine has them),
# PY (a python to ask about pip packages and torch; may be empty).
# Sets: CMAKE NINJA CXX_BIN NVCC ARCH CMAKE_ARGS (gpu_find_tools), EXTRA_LD and more
# CMAKE_ARGS (gpu_find_deps), HICOLL_NCCL_LIB (gpu_find_nccl, exported when found).

left() { echo $((BUDGET - ($(date +%s) - START))); }
step_timeout() {  # min(wanted, time left - 10), at least 5
  local want=$1 l
  l=$(($(left) - 10))
  [ "$l" -lt "$want" ] && want=$l
  [ "$want" -lt 5 ] && want=5
  echo "$want"
}
say() { echo "== [$(($(date +%s) - START))s] $*"; }
first() { for c in "$@"; do [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }; done; return 1; }
pyexec() { [ -n "${PY:-}" ] && "$PY" -c "$1" 2>/dev/null; }

# libnccl.so.2 for libhicoll's fallback: $HICOLL_NCCL_LIB, pip's nvidia-nccl, torch's, the system's.
gpu_find_nccl() {
  local c nccl=""
  for c in "${HICOLL_NCCL_LIB:-}" \
    "$(pyexec 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))')" \
    "$(pyexec 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libnccl.so.2"))')" \
    /usr/lib/x86_64-linux-gnu/libnccl.so.2 /usr/local/cuda/lib64/libnccl.so.2 /usr/local/cuda/lib/libnccl.so.2 \
    /usr/local/lib/libnccl.so.2; do
    [ -n "$c" ] && [ -f "$c" ] && { nccl=$c; break; }
  done
  [ -z "$nccl" ] && nccl=$(ldconfig -p 2>/dev/null | awk '/libnccl.so.2 / {print $NF; exit}')
  say "NCCL for libhicoll's fallback: ${nccl:-none found}"
  [ -n "$nccl" ] && export HICOLL_NCCL_LIB=$nccl
  return 0
}

gpu_find_tools() {
  CMAKE=$(first "$(command -v cmake)" "$(pyexec 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))')") || CMAKE=""
  NINJA=$(first "$(command -v ninja)" "$(pyexec 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))')") || NINJA=""
  CXX_BIN=$(first "${CXX:-}" "$(command -v g++)" "$(command -v c++)" "$(command -v clang++)") || CXX_BIN=""
  NVCC=$(first "${CUDACXX:-}" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" /usr/local/cuda/bin/nvcc "$(command -v nvcc)" \
    "$(pyexec 'import nvidia.cuda_nvcc, os; print(os.path.join(list(nvidia.cuda_nvcc.__path__)[0], "bin", "nvcc"))')") || NVCC=""
  ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [ -z "$ARCH" ] && ARCH=90
  say "tools: cmake=${CMAKE:--} ninja=${NINJA:--} c++=${CXX_BIN:--} nvcc=${NVCC:--} arch=sm_$ARCH"
  # -allow-unsupported-compiler: the machine's g++ may be newer than its nvcc officially knows.
  CMAKE_ARGS=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_CUDA_FLAGS=-allow-unsupported-compiler)
  [ -n "$NINJA" ] && CMAKE_ARGS+=(-G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA")
  [ -n "$CXX_BIN" ] && CMAKE_ARGS+=(-DCMAKE_CXX_COMPILER="$CXX_BIN" -DCMAKE_CUDA_HOST_COMPILER="$CXX_BIN")
  [ -n "$NVCC" ] && CMAKE_ARGS+=(-DCMAKE_CUDA_COMPILER="$NVCC")
  return 0
}

# libfabric (the machine's, or the carried one behind a pkg-config shim), fmt (the machine's
# CMake package, else header-only from the carried or torch's headers), nlohmann_json.
gpu_find_deps() {
  EXTRA_LD=""
  mkdir -p "$SHIM/bin"
  local fab_inc="" fab_lib=""
  if [ "$CARRIED" != 1 ] && pkg-config --exists libfabric 2>/dev/null; then
    say "libfabric: the machine's ($(pkg-config --modversion libfabric))"
  elif [ "$CARRIED" != 1 ] && [ -f /usr/include/rdma/fabric.h ] && ls /usr/lib/x86_64-linux-gnu/libfabric.so >/dev/null 2>&1; then
    fab_inc=/usr/include fab_lib=/usr/lib/x86_64-linux-gnu
    say "libfabric: the machine's, without a pkg-config entry"
  elif [ -d "$DEPS/libfabric" ]; then
    fab_inc=$DEPS/libfabric/include fab_lib=$DEPS/libfabric/lib
    EXTRA_LD=$fab_lib
    say "libfabric: carried from the dev machine ($(cat "$DEPS/libfabric/VERSION" 2>/dev/null), Debian build)"
  else
    say "libfabric: not found and nothing carried (run tests/gpu/pack_deps.sh and carry build-gpu-deps)"
  fi
  if [ -n "$fab_inc" ]; then
    mkdir -p "$SHIM/pkgconfig"
    cat > "$SHIM/pkgconfig/libfabric.pc" <<EOF
prefix=$(dirname "$fab_inc")
includedir=$fab_inc
libdir=$fab_lib
Name: libfabric
Description: libfabric (for the hicoll GPU checks)
Version: 1.17.0
Cflags: -I\${includedir}
Libs: -L\${libdir} -lfabric
EOF
    export PKG_CONFIG_PATH=$SHIM/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    if [ "$CARRIED" = 1 ] || ! command -v pkg-config >/dev/null; then
      # Answers FindPkgConfig's questions about libfabric, and only those.
      cat > "$SHIM/bin/pkg-config" <<EOF
#!/bin/sh
out=""
for a in "\$@"; do
  case "\$a" in
    --version) echo 0.29.2; exit 0 ;;
    --modversion) out="1.17.0" ;;
    --variable=prefix) out="$(dirname "$fab_inc")" ;;
    --variable=includedir) out="$fab_inc" ;;
    --variable=libdir) out="$fab_lib" ;;
    --variable=*) out="" ;;
    --cflags|--cflags-only-I) out="-I$fab_inc" ;;
    --libs) out="-L$fab_lib -lfabric" ;;
    --libs-only-L) out="-L$fab_lib" ;;
    --libs-only-l) out="-lfabric" ;;
    --cflags-only-other|--libs-only-other|--exists|--print-errors|--short-errors|--static|libfabric) ;;
    *) echo "pkg-config shim: only libfabric is known" >&2; exit 1 ;;
  esac
done
[ -n "\$out" ] && echo "\$out"
exit 0
EOF
      chmod +x "$SHIM/bin/pkg-config"
      CMAKE_ARGS+=(-DPKG_CONFIG_EXECUTABLE="$SHIM/bin/pkg-config")
      say "pkg-config: a shim for libfabric"
    fi
  fi

  if [ "$CARRIED" = 1 ] || ! ls /usr/lib/*/cmake/fmt/fmt-config.cmake /usr/lib/cmake/fmt/fmt-config.cmake \
    /usr/local/lib*/cmake/fmt/fmt-config.cmake /usr/lib64/cmake/fmt/fmt-config.cmake >/dev/null 2>&1; then
    local fmt_inc="" t
    if [ -f "$DEPS/fmt/include/fmt/format.h" ]; then
      fmt_inc=$DEPS/fmt/include
    else
      t=$(pyexec 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
      [ -n "$t" ] && [ -f "$t/fmt/format.h" ] && fmt_inc=$t
    fi
    if [ -n "$fmt_inc" ]; then
      # Only fmt's headers on this include path (torch's include dir holds much more).
      mkdir -p "$SHIM/fmt-include" "$SHIM/fmt-cmake"
      rm -rf "$SHIM/fmt-include/fmt"
      ln -s "$fmt_inc/fmt" "$SHIM/fmt-include/fmt"
      cat > "$SHIM/fmt-cmake/fmt-config.cmake" <<EOF
if(NOT TARGET fmt::fmt)
  add_library(fmt::fmt INTERFACE IMPORTED)
  set_target_properties(fmt::fmt PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "$SHIM/fmt-include"
                        INTERFACE_COMPILE_DEFINITIONS "FMT_HEADER_ONLY=1")
endif()
set(fmt_FOUND TRUE)
EOF
      CMAKE_ARGS+=(-Dfmt_DIR="$SHIM/fmt-cmake")
      say "fmt: header-only from $fmt_inc"
    else
      say "fmt: not found"
    fi
  else
    say "fmt: the machine's"
  fi

  # nlohmann_json (required by src/sharded): the machine's, else the carried package.
  if [ "$CARRIED" = 1 ] || ! ls /usr/share/cmake/nlohmann_json /usr/lib/*/cmake/nlohmann_json /usr/lib/cmake/nlohmann_json \
    /usr/local/share/cmake/nlohmann_json /usr/local/lib*/cmake/nlohmann_json >/dev/null 2>&1; then
    if [ -d "$DEPS/json/share/cmake/nlohmann_json" ]; then
      CMAKE_ARGS+=(-Dnlohmann_json_DIR="$DEPS/json/share/cmake/nlohmann_json")
      say "nlohmann_json: carried"
    else
      say "nlohmann_json: not found"
    fi
  fi
  return 0
}
