#!/usr/bin/env bash
# scripts/gpu_check.sh: verify hostreg's cuda backend on a machine with an NVIDIA GPU.
#
#   scripts/gpu_check.sh                 # build (CMake, no network, no pip), then run every check
#   scripts/gpu_check.sh --dry-run       # no GPU: CUDA driver test double, CPU tensors, tiny sizes
#   scripts/gpu_check.sh --dry-run --no-build   # ... with the hostreg already importable (.venv)
#
# Options (the rest go to the gpu_check package, scripts/gpu_check/; see --help there):
#   --dry-run          run here without a GPU (see docs/gpu-check.md for what is replaced)
#   --no-build         skip the CMake build; use whatever `import hostreg` finds
#   --build-dir DIR    build tree (default build/gpu, dry run build/gpu-dry)
#   -h, --help         this text
# Environment: PYTHON (default python3; dry run: .venv/bin/python when present),
#   OUT (logs go to $OUT/gpu_check, else <build dir>/logs), GPU_CHECK_TIMEOUT_S (limit of
#   the checks after the build, default 360), HOSTREG_CUDA_LIBRARY (dry run: the driver double).
#
# Steps: build with
#   cmake -S . -B build/gpu -G Ninja -DHOSTREG_BUILD_PYTHON=ON -DCMAKE_BUILD_TYPE=Release
# install the package with `cmake --install build/gpu --component python --prefix build/gpu/py`,
# then run `python -m gpu_check` (scripts/gpu_check/) with PYTHONPATH there and HOSTREG_BACKEND=cuda.
# It prints a plain-text table last; exit status 0 when every row is PASS or INFO, 1 when a
# check fails or could not run, 2 for bad usage.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

dry=0
build=1
build_dir=""
py_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1; py_args+=(--dry-run) ;;
    --no-build) build=0 ;;
    --build-dir)
      [ $# -ge 2 ] || { echo "gpu_check.sh: --build-dir needs a directory" >&2; exit 2; }
      build_dir=$2; shift ;;
    --build-dir=*) build_dir=${1#--build-dir=} ;;
    -h|--help) usage; exit 0 ;;
    *) py_args+=("$1") ;;  # gpu_check validates these
  esac
  shift
done

if [ -z "${PYTHON:-}" ]; then
  if [ $dry = 1 ] && [ -x .venv/bin/python ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi
PYTHON_PATH=$(command -v "$PYTHON") || { echo "gpu_check.sh: no Python interpreter '$PYTHON' (set PYTHON)" >&2; exit 2; }
PYTHON=$PYTHON_PATH

# Refuse bad arguments before spending a minute on the build.
export PYTHONPATH="$REPO/scripts${PYTHONPATH:+:$PYTHONPATH}"  # the gpu_check package
"$PYTHON" -m gpu_check "${py_args[@]}" --check-args || exit 2

build_dir=${build_dir:-build/$([ $dry = 1 ] && echo gpu-dry || echo gpu)}
case "$build_dir" in /*) ;; *) build_dir=$REPO/$build_dir ;; esac
if [ -n "${OUT:-}" ]; then log_dir=$OUT/gpu_check; else log_dir=$build_dir/logs; fi
mkdir -p "$log_dir" || exit 2
rm -f "$log_dir/table.txt"

# cmake and ninja may live beside the interpreter (a virtual environment's bin).
command -v cmake >/dev/null || PATH="$(dirname "$PYTHON"):$PATH"

say() { echo "gpu_check.sh: $*"; }

# ---- build ---------------------------------------------------------------------------------------
build_hostreg() {
  local gen=()
  "$PYTHON" -m nanobind --cmake_dir || { echo "nanobind is not importable by $PYTHON"; return 1; }
  command -v cmake >/dev/null || { echo "cmake not found"; return 1; }
  if command -v ninja >/dev/null; then gen=(-G Ninja); else echo "ninja not found: CMake's default generator"; fi
  # Python_EXECUTABLE: built for the interpreter that runs the checks.
  cmake -S . -B "$build_dir" "${gen[@]}" -DHOSTREG_BUILD_PYTHON=ON -DCMAKE_BUILD_TYPE=Release \
    -DPython_EXECUTABLE="$PYTHON" || return 1
  cmake --build "$build_dir" -j "$(nproc 2>/dev/null || echo 4)" || return 1
  rm -rf "$build_dir/py"
  cmake --install "$build_dir" --component python --prefix "$build_dir/py" || return 1
  ls -l "$build_dir/py/hostreg"
}

build_status=INFO
build_detail="not built (--no-build): hostreg as found on sys.path"
if [ $build = 1 ]; then
  say "building hostreg in $build_dir (log: $log_dir/build.log)"
  t0=$(date +%s)
  if build_hostreg >"$log_dir/build.log" 2>&1; then
    build_status=PASS
    build_detail="$(( $(date +%s) - t0 )) s; package in ${build_dir#"$REPO"/}/py/hostreg"
    export PYTHONPATH="$build_dir/py${PYTHONPATH:+:$PYTHONPATH}"
    py_args+=(--expect-package "$build_dir/py/hostreg")
  else
    build_status=FAIL
    build_detail="build failed: $(grep -m1 -iE 'error|not found|failed' "$log_dir/build.log" | cut -c1-120)"
    say "build FAILED; last lines of $log_dir/build.log:"
    tail -n 25 "$log_dir/build.log"
  fi
fi

# ---- dry run: the CUDA driver test double stands in for libcuda.so.1 -------------------------------
if [ $dry = 1 ] && [ -z "${HOSTREG_CUDA_LIBRARY:-}" ]; then
  double=$build_dir/doubles/libhostreg_double_cuda.so
  src=tests/doubles/cuda_driver_double.cpp
  if [ ! -f "$double" ] || [ "$src" -nt "$double" ] || [ tests/doubles/double_common.hpp -nt "$double" ]; then
    mkdir -p "$(dirname "$double")"
    # As tests/doubles/CMakeLists.txt builds it: hidden symbols but the vendor ABI (exports.map).
    "${CXX:-c++}" -std=c++17 -O1 -fPIC -shared -fvisibility=hidden -Wl,--no-undefined \
      -Wl,--version-script=tests/doubles/exports.map "$src" -o "$double.tmp" -pthread >>"$log_dir/build.log" 2>&1 \
      && mv "$double.tmp" "$double" || { say "cannot build the CUDA driver double (see $log_dir/build.log)"; exit 1; }
  fi
  export HOSTREG_CUDA_LIBRARY=$double
fi

export HOSTREG_BACKEND=cuda
timeout_cmd=()
command -v timeout >/dev/null && timeout_cmd=(timeout -s INT -k 30 "${GPU_CHECK_TIMEOUT_S:-360}")

# The checks; their table is the last thing printed. SIGINT at the limit lets gpu_check
# mark what did not finish and still print the table.
"${timeout_cmd[@]}" "$PYTHON" -u -m gpu_check "${py_args[@]}" --log-dir "$log_dir" \
  --build-status "$build_status" --build-detail "$build_detail" 2>&1 | tee "$log_dir/stdout.log"
rc=${PIPESTATUS[0]}

if [ ! -s "$log_dir/table.txt" ] && [ "$rc" != 0 ]; then
  # gpu_check died before its table (or refused its arguments): a minimal one.
  echo
  echo "step  check                                      result  key figure"
  echo "1a    build (cmake Release, nanobind extension)  $build_status  $build_detail"
  echo "-     scripts/gpu_check                          FAIL    exited with $rc before its table (see $log_dir)"
  exit 1
fi
exit "$rc"
