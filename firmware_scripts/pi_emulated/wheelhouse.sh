#!/usr/bin/env bash
# Download the wheels a 64-bit Raspberry Pi (aarch64, Python 3.11 as on bookworm) needs, for
# `pi_setup.sh --wheelhouse DIR` on a board without Internet access. Runs on any machine with pip.
#
#   firmware_scripts/pi_emulated/wheelhouse.sh DIR [--backend numpy|torch] [--test]
#
# numpy (default): fedhar's dependencies and the pi extra (smbus2), plus setuptools to build the
# checkout. torch: also PyTorch's CPU build for aarch64 from https://download.pytorch.org/whl/cpu.
# --test: also pytest, to run the driver's tests on the board. PIP (default pip3) picks the pip.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
dir="" backend=numpy test=0
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) backend="$2"; shift 2 ;;
    --test) test=1; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "wheelhouse.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) dir="$1"; shift ;;
  esac
done
[ -n "$dir" ] || { echo "wheelhouse.sh: give the folder to fill, e.g. wheelhouse.sh ~/.cache/fedhar/wheelhouse" >&2; exit 2; }
pip="${PIP:-pip3}"
target=(--platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64
        --platform any --python-version 3.11 --implementation cp --only-binary=:all: --dest "$dir")
# The requirements as pyproject.toml states them, so the wheelhouse follows the project.
reqs="$(python3 - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["pi"]))
PY
)"
mapfile -t req_list <<<"$reqs"
"$pip" download -q "${target[@]}" "${req_list[@]}" "setuptools>=68"
if [ "$backend" = torch ]; then
  torch_req="$(python3 -c "import sys,tomllib; print(tomllib.load(open(sys.argv[1],'rb'))['project']['optional-dependencies']['client'][0])" "$repo/pyproject.toml")"
  "$pip" download -q "${target[@]}" --no-deps "$torch_req" --index-url https://download.pytorch.org/whl/cpu
  # torch's own dependencies are pure Python or on PyPI for aarch64.
  "$pip" download -q "${target[@]}" filelock typing-extensions sympy networkx jinja2 fsspec
fi
[ "$test" -eq 1 ] && "$pip" download -q "${target[@]}" pytest
echo "wheelhouse.sh: $(find "$dir" -name '*.whl' | wc -l) wheels, $(du -sh "$dir" | cut -f1) in $dir"
