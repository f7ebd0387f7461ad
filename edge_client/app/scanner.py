"""Scanning an enrolment bundle's QR code on Android, through a scanner app the phone already has.

The app holds no camera code of its own: it asks Android for an activity that answers the
ZXing scan Intent (``com.google.zxing.client.android.SCAN``, which the ZXing Barcode Scanner
app and several others registered), and gets the decoded text back in
``onActivityResult`` (python-for-android's :mod:`android.activity` hook, through pyjnius).
Where that is not possible (not Android, pyjnius missing, no scanner app installed) the
caller gets the reason in words and the file and paste imports remain.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("fedhar.app")

SCAN_ACTION = "com.google.zxing.client.android.SCAN"
"""The Intent action of the ZXing scanner protocol."""

SCAN_RESULT_EXTRA = "SCAN_RESULT"
"""The Intent extra that holds the decoded text."""

REQUEST_CODE = 0x5EB
"""``startActivityForResult`` request code of a scan (any number the app uses for nothing else)."""

RESULT_OK = -1
"""``android.app.Activity.RESULT_OK``."""

NOT_ANDROID = "QR scanning needs the Android app and a camera; import the bundle's .json file or paste its text instead"
NO_SCANNER = (
    "no QR scanner app on this phone answers the scan request (install one, e.g. ZXing Barcode Scanner); "
    "or import the bundle's .json file or paste its text"
)


def start_scan(on_text: Callable[[str | None], None]) -> str | None:
    """Ask a scanner app for one QR code; ``on_text`` gets its text, or None when the scan was cancelled.

    Parameters
    ----------
    on_text : callable
        Called once, later, on Android's UI thread (the caller moves it to Kivy's: ``Clock.schedule_once``).

    Returns
    -------
    str or None
        None when the scanner was started; otherwise why scanning is not available here
        (:data:`NOT_ANDROID`, :data:`NO_SCANNER`, or the Android error), and ``on_text`` is never called.
    """
    try:
        from android import activity as android_activity  # type: ignore[attr-defined,unused-ignore]  # python-for-android only
        from jnius import autoclass
    except ImportError:
        return NOT_ANDROID
    try:
        intent_class = autoclass("android.content.Intent")
        current = autoclass("org.kivy.android.PythonActivity").mActivity
        intent = intent_class(SCAN_ACTION)
        intent.putExtra("SCAN_MODE", "QR_CODE_MODE")
        if intent.resolveActivity(current.getPackageManager()) is None:
            return NO_SCANNER

        def on_result(request: int, result: int, data: Any) -> None:
            if request != REQUEST_CODE:
                return
            android_activity.unbind(on_activity_result=on_result)
            text = data.getStringExtra(SCAN_RESULT_EXTRA) if result == RESULT_OK and data is not None else None
            on_text(str(text) if text is not None else None)

        android_activity.bind(on_activity_result=on_result)
        current.startActivityForResult(intent, REQUEST_CODE)
    except Exception as exc:  # a Java exception through pyjnius: shown, never a crash of the app
        log.warning("QR scan could not start: %s", exc)
        return f"QR scan could not start ({exc}); import the bundle's .json file or paste its text"
    return None
