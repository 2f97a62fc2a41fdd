#!/bin/bash
# Installs the build into a temporary prefix, then builds a consumer with find_package(hicoll)
# and with pkg-config, and runs both.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/consumer/consumer"
PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" cc "$src/consumer/main.c" -o "$tmp/pc_consumer" \
  $(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs hicoll)
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/pc_consumer"
