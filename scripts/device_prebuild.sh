#!/usr/bin/env bash
# Builds the extension for the GPU machine on this (CPU) machine, so that a
# device call does not spend 2-3 of its minutes building it there.
# scripts/gpu_run.sh takes results/prebuilt (carry it with .device) when the
# tree hash recorded there is that of the tree it runs in, and the
# architectures are the run's (MLX_RMSNORM_CUDA_ARCHS, default 90).
#
#   PY312=/path/to/python3.12 bash scripts/device_prebuild.sh
#
# Needs: the GPU machine's Python (3.12: the extension is built for one
# interpreter ABI), nvcc, and the MLX CUDA wheels in .device/wheels
# (../shared/tools/device-wheels). The build runs in a copy of the tree under
# PREBUILD_DIR, whose build folder stays, so the next prebuild recompiles only
# what changed. MLX's CMake package asks for cuDNN, which the extension does
# not use (nothing of it is included or called): a stub library and header
# stand in for it here; on the GPU machine MLX has loaded the real one.
set -euo pipefail
ROOT="$PWD"
PY312="${PY312:-python3.12}"
ARCHS="${MLX_RMSNORM_CUDA_ARCHS:-90}"
WORK="${PREBUILD_DIR:-/tmp/mlx-rmsnorm-prebuild}"
OUT="$ROOT/results/prebuilt"

ls "$ROOT"/.device/wheels/mlx_cuda*.whl >/dev/null || { echo "no MLX CUDA wheels in .device/wheels"; exit 1; }
if [ ! -x "$WORK/venv/bin/python" ]; then
  "$PY312" -m venv "$WORK/venv"
  "$WORK/venv/bin/pip" install -q --disable-pip-version-check --no-deps "$ROOT"/.device/wheels/mlx*.whl
  "$WORK/venv/bin/pip" install -q --disable-pip-version-check nanobind==3.1.0 cmake ninja setuptools wheel
fi
stub="$WORK/cudnn-stub"
if [ ! -f "$stub/lib/libcudnn.so" ]; then
  mkdir -p "$stub/include" "$stub/lib"
  echo '#pragma once' >"$stub/include/cudnn.h"
  printf '#pragma once\n#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 0\n#define CUDNN_PATCHLEVEL 0\n' \
    >"$stub/include/cudnn_version.h"
  echo 'void mlx_rmsnorm_cudnn_stub(void) {}' >"$stub/stub.c"
  gcc -shared -fPIC -Wl,-soname,libcudnn.so.9 -o "$stub/lib/libcudnn.so" "$stub/stub.c"
  for name in cudnn_graph cudnn_engines_runtime_compiled cudnn_ops cudnn_cnn cudnn_adv \
              cudnn_engines_precompiled cudnn_heuristic; do
    cp "$stub/lib/libcudnn.so" "$stub/lib/lib$name.so"
  done
fi

# The tree as git sees it (tracked and untracked, not ignored), copied over
# the last copy; files gone from the tree are removed from the copy.
mkdir -p "$WORK/src"
(cd "$ROOT" && git ls-files -co --exclude-standard | sort) >"$WORK/files.new"
if [ -f "$WORK/files" ]; then
  comm -23 "$WORK/files" "$WORK/files.new" | (cd "$WORK/src" && xargs -r rm -f)
fi
# A file is copied only where its contents changed, and then gets the time
# of the copy: ninja rebuilds exactly what changed, also an edit made while
# an earlier prebuild was compiling (with the tree's own mtimes such an edit
# was older than its object file, and skipped).
rm -rf "$WORK/stage" && mkdir -p "$WORK/stage"
(cd "$ROOT" && tar -cf - -T "$WORK/files.new") | tar -xf - -C "$WORK/stage"
while IFS= read -r f; do
  if ! cmp -s "$WORK/stage/$f" "$WORK/src/$f"; then
    mkdir -p "$WORK/src/$(dirname "$f")" && cp "$WORK/stage/$f" "$WORK/src/$f"
  fi
done <"$WORK/files.new"
rm -rf "$WORK/stage"
mv "$WORK/files.new" "$WORK/files"

cd "$WORK/src"
PATH="$WORK/venv/bin:$PATH" MLX_RMSNORM_CUDA_ARCHS="$ARCHS" \
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  CMAKE_ARGS="-DCUDNN_INCLUDE_PATH=$stub/include -DCUDNN_LIBRARY_PATH=$stub/lib" \
  "$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
rm -rf "$OUT" && mkdir -p "$OUT"
cp mlx_rmsnorm/_ext.*.so mlx_rmsnorm/_build_info.py "$OUT/"
(cd "$ROOT" && python3 build_backend/dev_build.py tree-hash) >"$OUT/tree"
echo "$ARCHS" >"$OUT/archs"
ls -l "$OUT"
