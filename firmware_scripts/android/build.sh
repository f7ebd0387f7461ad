#!/usr/bin/env bash
# Stage the Android app and build a debug APK with buildozer (needs buildozer, a JDK 17 and
# the Android SDK/NDK that buildozer downloads on its first run; see docs/devices.md).
# The spec is checked before the build and the manifest python-for-android wrote after it
# (check_build.py: service type, permissions, pinned releases, packaging options).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
stage="${1:-$root/build/android}"
python3 "$here/check_build.py" --spec "$here/buildozer.spec" --pyproject "$root/pyproject.toml"
mkdir -p "$stage"
rm -rf "$stage/har_models" "$stage/har_io" "$stage/edge_client"
cp "$here/buildozer.spec" "$here/main.py" "$here/service.py" "$stage/"
# The phone-side packages (core, adapters, client); the PyTorch-only modules come along but are never imported on the phone.
cp -r "$root/har_models" "$root/har_io" "$root/edge_client" "$stage/"
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
cd "$stage"
buildozer android debug
manifest="$(ls -t .buildozer/android/platform/build-*/dists/fedhar/src/main/AndroidManifest.xml 2>/dev/null | head -n 1 || true)"
if [ -z "$manifest" ]; then
    echo "build.sh: no AndroidManifest.xml under .buildozer/android/platform/build-*/dists/fedhar to check" >&2
    exit 1
fi
python3 "$here/check_build.py" --spec "$here/buildozer.spec" --pyproject "$root/pyproject.toml" --manifest "$manifest"
