"""The Android build's settings, read as buildozer and python-for-android read them.

The spec is parsed with configparser (buildozer's own format), the manifest with
xml.etree; nothing here builds an APK (that needs the Android SDK and NDK), so the manifest
checked is written as python-for-android 2026.05.09's template writes it for this spec.
The Android APIs the app calls at run time (runtime permissions, the battery) are replaced
by small stand-ins, since there is no phone here.
"""

from __future__ import annotations

import configparser
import sys
import tomllib
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "firmware_scripts" / "android"))

import check_build  # noqa: E402

SPEC = ROOT / "firmware_scripts" / "android" / "buildozer.spec"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _spec() -> configparser.ConfigParser:
    return check_build.read_spec(SPEC)


def test_spec_values():
    spec = _spec()
    assert check_build.services(spec) == {
        "Sensing": {"entrypoint": "service.py", "foreground": True, "sticky": True, "foregroundServiceType": "health"}
    }
    perms = check_build.spec_list(spec, "android.permissions")
    assert set(perms) >= {"FOREGROUND_SERVICE", "FOREGROUND_SERVICE_HEALTH", "HIGH_SAMPLING_RATE_SENSORS", "POST_NOTIFICATIONS"}
    assert "FOREGROUND_SERVICE_DATA_SYNC" not in perms
    assert spec.get("app", "android.api") == "35"
    assert spec.get("app", "p4a.branch") == "v2026.05.09"  # a release tag, not master
    reqs = check_build.spec_list(spec, "requirements")
    py = check_build.pinned(reqs, "python3")
    assert py == check_build.pinned(reqs, "hostpython3") == "3.11.7"
    # the CPython of the APK is the minor version these tests run and the project's type checks assume
    assert tuple(int(v) for v in py.split(".")[:2]) == sys.version_info[:2]
    assert PYPROJECT["tool"]["mypy"]["python_version"] == "3.11" and PYPROJECT["project"]["requires-python"] == ">=3.11"
    assert check_build.spec_list(spec, "android.gradle_dependencies") == ["org.pytorch:executorch-android:1.4.0"]
    assert PYPROJECT["project"]["optional-dependencies"]["executorch"] == ["executorch==1.4.0"]  # the exporter
    assert check_build.spec_list(spec, "android.add_packaging_options") == ["pickFirst '**/libc++_shared.so'"]
    assert "scipy" not in spec.get("app", "requirements") and "torch" not in spec.get("app", "requirements")
    assert check_build.spec_problems(spec, PYPROJECT) == []
    # the phone runs the releases the desktops and these tests run
    assert check_build.pinned(reqs, "paho-mqtt") == "2.2.0" and "paho-mqtt==2.2.0" in PYPROJECT["project"]["dependencies"]
    assert check_build.pinned(reqs, "kivy") == "2.3.1" and PYPROJECT["project"]["optional-dependencies"]["app"] == ["kivy==2.3.1"]


def test_a_spec_pin_other_than_pyprojects_is_a_problem():
    project = {"project": {"dependencies": ["numpy>=1.26", "paho-mqtt==2.2.0"], "optional-dependencies": {"app": ["kivy>=2.3"]}}}
    reqs = ["python3==3.11.7", "hostpython3==3.11.7", "kivy==2.3.1", "numpy", "pyjnius", "paho-mqtt==2.1.0"]
    assert check_build.pyproject_pins_differing(reqs, project) == [
        ("kivy", ("2.3.1", "kivy>=2.3")),
        ("paho-mqtt", ("2.1.0", "paho-mqtt==2.2.0")),
    ]
    reqs = ["python3==3.11.7", "kivy", "numpy==2.1.0", "paho-mqtt==2.2.0"]  # a pin where pyproject gives a range differs too
    assert check_build.pyproject_pins_differing(reqs, project) == [("numpy", ("2.1.0", "numpy>=1.26"))]
    spec = _spec()
    spec.set("app", "requirements", spec.get("app", "requirements").replace("paho-mqtt==2.2.0", "paho-mqtt==2.1.0"))
    assert check_build.spec_problems(spec, PYPROJECT) == [
        "requirements: paho-mqtt==2.1.0 but pyproject.toml has 'paho-mqtt==2.2.0': pin both to the same version"
    ]


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("services", "Sensing:service.py:foreground:sticky:foregroundServiceType=dataSync", "foregroundServiceType=health"),
        ("p4a.branch", "master", "release tag"),
        ("android.gradle_dependencies", "org.pytorch:executorch-android:1.0.1", "executorch==1.4.0"),
        ("android.add_packaging_options", "", "libc++_shared.so"),
        ("requirements", "python3==3.14.2,hostpython3==3.14.2,kivy==2.3.1,numpy", "not the Python 3.11"),
        ("requirements", "python3,kivy", "same version"),
        ("android.api", "34", "target SDK 35"),
        ("android.permissions", "INTERNET, FOREGROUND_SERVICE, FOREGROUND_SERVICE_DATA_SYNC", "FOREGROUND_SERVICE_HEALTH is missing"),
    ],
)
def test_spec_problems_are_named(key, value, words):
    spec = _spec()
    spec.set("app", key, value)
    problems = check_build.spec_problems(spec, PYPROJECT)
    assert any(words in p for p in problems), problems


def _manifest(spec: configparser.ConfigParser, service_type: str = "health", drop: str = "") -> str:
    """The parts of python-for-android's AndroidManifest.tmpl.xml (release 2026.05.09) that depend on the spec."""
    perms = "\n".join(
        f'    <uses-permission android:name="android.permission.{p}" />'
        for p in check_build.spec_list(spec, "android.permissions")
        if p != drop
    )
    package = f"{spec.get('app', 'package.domain')}.{spec.get('app', 'package.name')}"
    return f"""<?xml version="1.0" encoding="utf-8"?>
<manifest xmlns:android="http://schemas.android.com/apk/res/android" android:versionCode="1" android:versionName="0.1.0">
    <uses-sdk android:minSdkVersion="{spec.get("app", "android.minapi")}" android:targetSdkVersion="{spec.get("app", "android.api")}" />
{perms}
    <application android:label="@string/app_name">
        <service android:name="org.kivy.android.PythonService" android:process=":pythonservice" />
        <service android:name="{package}.ServiceSensing"
                 android:foregroundServiceType="{service_type}"
                 android:process=":service_Sensing" />
    </application>
</manifest>
"""


def test_manifest_values():
    spec = _spec()
    assert check_build.manifest_problems(_manifest(spec), spec) == []
    assert check_build.manifest_problems(_manifest(spec, service_type="dataSync"), spec) == [
        "manifest: org.fedhar.fedhar.ServiceSensing has foregroundServiceType='dataSync'"
    ]
    assert check_build.manifest_problems(_manifest(spec, drop="POST_NOTIFICATIONS"), spec) == [
        "manifest: <uses-permission> android.permission.POST_NOTIFICATIONS is missing"
    ]


def test_check_build_command(tmp_path):
    import subprocess

    script = ROOT / "firmware_scripts" / "android" / "check_build.py"
    (tmp_path / "AndroidManifest.xml").write_text(_manifest(_spec()))
    r = subprocess.run([sys.executable, str(script), "--manifest", str(tmp_path / "AndroidManifest.xml")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == ""
    bad = tmp_path / "buildozer.spec"
    bad.write_text(SPEC.read_text().replace("p4a.branch = v2026.05.09", "p4a.branch = master"))
    r = subprocess.run([sys.executable, str(script), "--spec", str(bad)], capture_output=True, text=True)
    assert r.returncode == 1 and "p4a.branch = 'master'" in r.stderr


# ---------------------------------------------------------------------------------------
# Run-time Android calls, against stand-ins for the Android classes


def test_notification_permission_is_asked_before_the_service_starts(monkeypatch):
    from edge_client.app import main as app_main

    asked: list = []
    granted: set[str] = set()
    fake = types.ModuleType("android.permissions")
    fake.check_permission = lambda p: p in granted

    def request_permissions(perms, callback):
        asked.append(list(perms))
        callback(perms, [False] * len(perms))  # the owner says no: the service still starts

    fake.request_permissions = request_permissions
    monkeypatch.setitem(sys.modules, "android", types.ModuleType("android"))
    monkeypatch.setitem(sys.modules, "android.permissions", fake)
    started: list[int] = []
    app_main.request_android_permissions(lambda: started.append(1))
    assert asked == [["android.permission.POST_NOTIFICATIONS"]] and started == [1]
    granted.add("android.permission.POST_NOTIFICATIONS")
    app_main.request_android_permissions(lambda: started.append(2))
    assert asked == [["android.permission.POST_NOTIFICATIONS"]] and started == [1, 2]  # granted: not asked again


class _Battery:
    def __init__(self, charging: bool):
        self.charging = charging

    def isCharging(self) -> bool:  # noqa: N802 (the Java method's name)
        return self.charging


class _Ctx:
    def __init__(self, charging: bool):
        self.battery = _Battery(charging)
        self.asked: list[str] = []

    def getSystemService(self, name: str):  # noqa: N802
        self.asked.append(name)
        return self.battery


def _jnius(service, activity):
    classes = {
        "org.kivy.android.PythonService": types.SimpleNamespace(mService=service),
        "org.kivy.android.PythonActivity": types.SimpleNamespace(mActivity=activity),
        "android.content.Context": types.SimpleNamespace(BATTERY_SERVICE="batterymanager"),
    }
    mod = types.ModuleType("jnius")
    mod.autoclass = classes.__getitem__
    return mod


def test_charging_is_read_through_the_service_context(monkeypatch):
    from edge_client import power

    service = _Ctx(charging=False)
    monkeypatch.setitem(sys.modules, "jnius", _jnius(service, None))  # the service's process: no activity
    assert power.charging_android() is False and service.asked == ["batterymanager"]
    assert power.is_charging() is False  # before: null activity -> unknown -> "charging"
    monkeypatch.setitem(sys.modules, "jnius", _jnius(_Ctx(charging=True), None))
    assert power.is_charging() is True
    activity = _Ctx(charging=True)
    monkeypatch.setitem(sys.modules, "jnius", _jnius(None, activity))  # the UI's process: no service
    assert power.charging_android() is True and activity.asked == ["batterymanager"]
    monkeypatch.setitem(sys.modules, "jnius", _jnius(None, None))  # no context at all: a phone has a battery
    assert power.charging_android() is False and power.is_charging() is False
