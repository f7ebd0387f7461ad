#!/usr/bin/env bash
# Stage the Android app and build a debug APK with buildozer (needs buildozer, a JDK 17 and
# the Android SDK/NDK that buildozer downloads on its first run; see docs/devices.md).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
stage="${1:-$root/build/android}"
mkdir -p "$stage"
rm -rf "$stage/har_models" "$stage/edge_client"
cp "$here/buildozer.spec" "$here/main.py" "$here/service.py" "$stage/"
# The phone-side packages; the PyTorch-only modules come along but are never imported on the phone.
cp -r "$root/har_models" "$root/edge_client" "$stage/"
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
cd "$stage"
exec buildozer android debug
