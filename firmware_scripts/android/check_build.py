"""Check the Android build's settings: the buildozer spec before a build, the generated manifest after it.

Usage::

    python firmware_scripts/android/check_build.py [--spec buildozer.spec] [--pyproject pyproject.toml] [--manifest AndroidManifest.xml]

Exit status 0 when everything holds, 1 with one line per problem otherwise. ``build.sh``
runs the spec check before buildozer and the manifest check on the manifest
python-for-android wrote (``.buildozer/android/platform/build-*/dists/fedhar/src/main/AndroidManifest.xml``).

What must hold, and why (Android developer guide, "Foreground service types", and the
python-for-android release notes):

* the sensing service is a foreground service of type ``health``: ``dataSync`` is capped at
  6 hours a day from target SDK 35; ``health`` needs ``FOREGROUND_SERVICE_HEALTH`` and one of
  its runtime prerequisites (``HIGH_SAMPLING_RATE_SENSORS``, granted at install);
* ``POST_NOTIFICATIONS`` is declared (and asked at run time by the app, Android 13+);
* python-for-android is a release tag (``vYYYY.MM.DD``), not a branch that moves;
* the CPython built is the minor version the tests run (pyproject's mypy ``python_version``);
* the ExecuTorch AAR is the release of the exporter pinned in pyproject (``executorch==X``);
* Gradle is told what to do with the second ``libc++_shared.so`` (fbjni's next to numpy's);
* every package the spec pins that pyproject also names (``dependencies`` or the ``app`` extra)
  is pinned there to the same version, so the phone runs the release the desktops and the
  tests run (the spec once had paho-mqtt 2.1.0 while desktops resolved 2.2.0).
"""

from __future__ import annotations

import argparse
import configparser
import re
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ANDROID_NS = "{http://schemas.android.com/apk/res/android}"
REQUIRED_PERMISSIONS = ("INTERNET", "FOREGROUND_SERVICE", "FOREGROUND_SERVICE_HEALTH", "HIGH_SAMPLING_RATE_SENSORS", "POST_NOTIFICATIONS")
"""Permissions the sensing service and its notification need (names without ``android.permission.``)."""
SERVICE_NAME = "Sensing"
SERVICE_TYPE = "health"


def read_spec(path: Path) -> configparser.ConfigParser:
    """The buildozer spec as buildozer reads it (an INI file; keys keep their case and dots).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    """
    spec = configparser.ConfigParser(interpolation=None)
    spec.optionxform = str  # type: ignore[assignment,method-assign]
    with open(path) as f:
        spec.read_file(f)
    return spec


def spec_list(spec: configparser.ConfigParser, key: str) -> list[str]:
    """A comma-separated ``[app]`` value as buildozer splits it (stripped items; [] when absent)."""
    raw = spec.get("app", key, fallback="")
    return [x.strip() for x in raw.split(",") if x.strip()]


def services(spec: configparser.ConfigParser) -> dict[str, dict[str, str | bool]]:
    """``services = NAME:ENTRYPOINT[:OPTION...]`` parsed as python-for-android parses it.

    Returns
    -------
    dict
        Name -> ``{"entrypoint", "foreground", "sticky", "foregroundServiceType"}``.
    """
    out: dict[str, dict[str, str | bool]] = {}
    for item in spec_list(spec, "services"):
        name, entry, *options = item.split(":")
        kinds = [o.split("=", 1)[1] for o in options if o.startswith("foregroundServiceType=")]
        out[name] = {
            "entrypoint": entry,
            "foreground": "foreground" in options,
            "sticky": "sticky" in options,
            "foregroundServiceType": kinds[0] if kinds else "",
        }
    return out


def pinned(requirements: list[str], name: str) -> str | None:
    """The version pinned for ``name`` in a requirements list (``name==X``), or None."""
    for req in requirements:
        n, sep, version = req.partition("==")
        if n.strip() == name and sep:
            return version.strip()
    return None


def pyproject_pins_differing(requirements: list[str], pyproject: dict) -> list[tuple[str, tuple[str, str]]]:
    """The spec's pins ``name==X`` whose package pyproject names with another requirement than ``name==X``.

    Returns ``(name, (spec version, pyproject requirement))`` for each; python3 and hostpython3
    (the interpreter, checked on its own) are left out.
    """
    declared = [*pyproject["project"].get("dependencies", []), *pyproject["project"].get("optional-dependencies", {}).get("app", [])]
    by_name = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].strip().lower(): d.replace(" ", "") for d in declared}
    out = []
    for req in requirements:
        name, sep, version = req.partition("==")
        name = name.strip().lower()
        if not sep or name in ("python3", "hostpython3") or name not in by_name:
            continue
        if by_name[name] != f"{name}=={version.strip()}":
            out.append((name, (version.strip(), by_name[name])))
    return out


def spec_problems(spec: configparser.ConfigParser, pyproject: dict) -> list[str]:
    """Everything wrong with the spec against the rules in this module's docstring ([] when none).

    Parameters
    ----------
    spec : ConfigParser
        From :func:`read_spec`.
    pyproject : dict
        The project's ``pyproject.toml``, parsed (``tomllib``).
    """
    problems: list[str] = []
    svc = services(spec).get(SERVICE_NAME)
    if svc is None:
        problems.append(f"services: no {SERVICE_NAME} service")
    elif not svc["foreground"] or svc["foregroundServiceType"] != SERVICE_TYPE:
        problems.append(f"services: {SERVICE_NAME} must be foreground with foregroundServiceType={SERVICE_TYPE}, got {svc}")
    perms = set(spec_list(spec, "android.permissions"))
    for p in REQUIRED_PERMISSIONS:
        if p not in perms:
            problems.append(f"android.permissions: {p} is missing")
    if "FOREGROUND_SERVICE_DATA_SYNC" in perms:
        problems.append("android.permissions: FOREGROUND_SERVICE_DATA_SYNC is left over from the dataSync service type")
    api = spec.getint("app", "android.api", fallback=0)
    if api < 35:
        problems.append(f"android.api = {api}: target SDK 35 or newer (Play's requirement; health is the type that fits there)")
    branch = spec.get("app", "p4a.branch", fallback="")
    if not re.fullmatch(r"v\d{4}\.\d{2}\.\d{2}", branch):
        problems.append(f"p4a.branch = {branch!r}: pin a python-for-android release tag (vYYYY.MM.DD), not a branch")
    reqs = spec_list(spec, "requirements")
    py, host = pinned(reqs, "python3"), pinned(reqs, "hostpython3")
    tested = str(pyproject.get("tool", {}).get("mypy", {}).get("python_version", ""))
    if py is None or py != host:
        problems.append(f"requirements: pin python3 and hostpython3 to the same version, got {py} and {host}")
    elif ".".join(py.split(".")[:2]) != tested:
        problems.append(f"requirements: python3=={py} is not the Python {tested} the tests run")
    exporter = next((pinned([d], "executorch") for d in pyproject["project"]["optional-dependencies"].get("executorch", [])), None)
    aar = [d.rsplit(":", 1)[-1] for d in spec_list(spec, "android.gradle_dependencies") if d.startswith("org.pytorch:executorch-android:")]
    if aar != [exporter]:
        problems.append(f"android.gradle_dependencies: executorch-android {aar} must equal the exporter's executorch=={exporter}")
    for name, version in pyproject_pins_differing(reqs, pyproject):
        problems.append(f"requirements: {name}=={version[0]} but pyproject.toml has {version[1]!r}: pin both to the same version")
    options = spec_list(spec, "android.add_packaging_options")
    if not any("libc++_shared.so" in o and o.startswith(("pickFirst", "jniLibs.pickFirsts")) for o in options):
        problems.append("android.add_packaging_options: no pickFirst rule for libc++_shared.so (Gradle: 2 files found)")
    return problems


def manifest_problems(xml_text: str, spec: configparser.ConfigParser) -> list[str]:
    """Everything wrong with a generated ``AndroidManifest.xml`` against the spec ([] when none).

    Checks the declared permissions, the sensing service's ``foregroundServiceType`` and the
    target SDK, reading the XML (``xml.etree``), not matching text.

    Raises
    ------
    xml.etree.ElementTree.ParseError
        If the text is not XML.
    """
    root = ET.fromstring(xml_text)
    problems: list[str] = []
    declared = {e.get(f"{ANDROID_NS}name", "") for e in root.iter("uses-permission")}
    for p in spec_list(spec, "android.permissions"):
        full = p if "." in p else f"android.permission.{p}"
        if full not in declared:
            problems.append(f"manifest: <uses-permission> {full} is missing")
    package = f"{spec.get('app', 'package.domain')}.{spec.get('app', 'package.name')}"
    want = f"{package}.Service{SERVICE_NAME}"
    found = [e for e in root.iter("service") if e.get(f"{ANDROID_NS}name") == want]
    if not found:
        problems.append(f"manifest: no <service> {want}")
    elif found[0].get(f"{ANDROID_NS}foregroundServiceType") != SERVICE_TYPE:
        problems.append(f"manifest: {want} has foregroundServiceType={found[0].get(f'{ANDROID_NS}foregroundServiceType')!r}")
    sdk = root.find("uses-sdk")
    target = sdk.get(f"{ANDROID_NS}targetSdkVersion") if sdk is not None else None
    if target != spec.get("app", "android.api"):
        problems.append(f"manifest: targetSdkVersion {target} is not android.api {spec.get('app', 'android.api')}")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 when the spec (and the manifest, if given) pass, 1 with the problems printed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=HERE / "buildozer.spec")
    ap.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    ap.add_argument("--manifest", type=Path, default=None, help="AndroidManifest.xml written by python-for-android")
    args = ap.parse_args(argv)
    spec = read_spec(args.spec)
    problems = spec_problems(spec, tomllib.loads(args.pyproject.read_text()))
    if args.manifest is not None:
        problems += manifest_problems(args.manifest.read_text(), spec)
    for p in problems:
        print(f"check_build: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
