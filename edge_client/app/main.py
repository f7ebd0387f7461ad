"""``fedhar-app``: the Kivy app on the device (Android, Raspberry Pi with a screen, desktop Linux).

Five screens (:mod:`edge_client.app.screens`): **Today** (the day's recognised activity, minutes
against a weekly goal, relabelling, CSV export), **Record**, **Live** (the current model's activity
at every 1.28 s hop), **Federation** (how to join, entered by hand or by **Enrol** from a bundle;
the server's state, the round, every failure in words, what left the phone, what taking part
costs, leaving) and **History**. The screens only show what
:class:`~edge_client.app.controller.DeviceController` reports, moved onto the UI thread with
``Clock.schedule_once``. Kivy parses ``sys.argv`` and opens a window when imported, so :func:`main`
parses the options first and imports Kivy in the environment :func:`prepare_kivy` sets.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_client.app.controller import APP_BACKENDS, AppConfig, DeviceController, default_data_dir
from edge_client.app.window_size import kivy_environment, parse_size, saved_window
from edge_client.sensors.base import SensorSource
from edge_client.sensors.factory import make_source
from har_io import exit_codes
from har_io.cli import HelpFormatter, add_logging_arguments
from har_io.exit_codes import Exit, fail
from har_io.install_hints import install_hint
from har_models.data.labels import LABEL_SETS

log = logging.getLogger("fedhar.app")


def build_parser() -> argparse.ArgumentParser:
    """Options of ``fedhar-app``."""
    on_android = "ANDROID_ARGUMENT" in os.environ or "ANDROID_PRIVATE" in os.environ
    ap = argparse.ArgumentParser(
        prog="fedhar-app",
        description="fedhar on a device: record activities, see live predictions, federate",
        epilog=exit_codes.epilog(exit_codes.APP),
        formatter_class=HelpFormatter,
    )
    ap.add_argument("--state-dir", type=Path, default=None, help="device store (default: the app's data folder)")
    ap.add_argument("--client-id", default=None, help="device id in the federation (default: this host's name)")
    ap.add_argument("--broker", default="127.0.0.1:1883", help="MQTT broker HOST:PORT (default %(default)s)")
    ap.add_argument("--federation", default="default", help="federation name (default %(default)s)")
    ap.add_argument("--username", default=None, help="MQTT user name (a device's is its client id)")
    ap.add_argument("--password-file", type=Path, default=None, help="file holding the MQTT password")
    ap.add_argument("--tls-ca", type=Path, default=None, help="CA certificate: connect with TLS")
    ap.add_argument(
        "--backend", default="auto", choices=APP_BACKENDS, help="training backend (default %(default)s: the client's own choice)"
    )
    ap.add_argument("--labels", default="hapt6", choices=sorted(LABEL_SETS), help="activities to record (default %(default)s)")
    ap.add_argument(
        "--sensor",
        default="android" if on_android else "replay:hapt:datasets/hapt/user01.npz",
        help="android | mpu6050[:BUS[:ADDRESS]] | replay:SOURCE (default %(default)s)",
    )
    ap.add_argument("--replay-speed", type=float, default=1.0, help="replay speed, 1 = real time (default %(default)s)")
    ap.add_argument("--max-windows", type=int, default=20_000, help="bound of the recorded-window log (default %(default)s)")
    ap.add_argument("--size", type=_size_option, default=None, metavar="WIDTHxHEIGHT",
                    help="window size in pixels, e.g. 480x800, or auto (default: the size saved in the app's settings, "
                         "else 800x600 where it fits the display and the display's size where it does not)")  # fmt: skip
    ap.add_argument("--fullscreen", action="store_true", help="open the window full screen")
    add_logging_arguments(ap, progress=False)
    return ap


def _size_option(text: str) -> tuple[int, int] | str:
    """``--size``: WIDTHxHEIGHT, or "auto" (kept as the word: it overrides a saved size)."""
    try:
        size = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return "auto" if size is None else size


def config_from_args(args: argparse.Namespace, data_dir: Path) -> AppConfig:
    """The app's settings from parsed options (``data_dir``: the platform's folder for app data); the window from
    ``--size``/``--fullscreen``, else the choice saved on the History screen, else "auto"."""
    cid = args.client_id or "".join(c if c.isalnum() or c in "_.-" else "-" for c in socket.gethostname())[:64] or "device"
    state_dir = args.state_dir or data_dir / "fedhar"
    size, full = saved_window(state_dir)
    if args.size is not None or args.fullscreen:
        size, full = (None if args.size in (None, "auto") else args.size), bool(args.fullscreen)
    return AppConfig(state_dir=state_dir, labels=LABEL_SETS[args.labels], client_id=cid, broker=args.broker, federation=args.federation,
                     max_windows=args.max_windows, username=args.username, password_file=args.password_file, tls_ca=args.tls_ca,
                     backend=args.backend, window_size=size, fullscreen=full)  # fmt: skip


RUNTIME_PERMISSIONS = ("android.permission.POST_NOTIFICATIONS",)
"""Permissions asked for at start: the service's notification (runtime from Android 13); the sensors need none at
50 Hz, and ``HIGH_SAMPLING_RATE_SENSORS`` is granted at install."""


def request_android_permissions(then: Callable[[], None]) -> None:
    """Ask for :data:`RUNTIME_PERMISSIONS` not yet granted, then call ``then`` (granted or not; without the notification
    the foreground service runs hidden). Off Android ``then`` is called at once."""
    try:
        from android.permissions import check_permission, request_permissions  # python-for-android only
    except ImportError:
        then()
        return
    missing = [p for p in RUNTIME_PERMISSIONS if not check_permission(p)]
    if not missing:
        then()
        return

    def answered(permissions: list[str], grants: list[bool]) -> None:
        for name, ok in zip(permissions, grants, strict=False):
            if not ok:
                log.warning("%s was refused: the sensing service runs without a visible notification", name)
        then()

    request_permissions(missing, answered)


def start_android_service(on_error: Callable[[BaseException], None] | None = None) -> None:
    """Ask for the runtime permissions, then start the foreground service "Sensing" (``Service<Name>`` in the package).

    An exception of the later start (Android 12+: ``ForegroundServiceStartNotAllowedException`` in the
    background) goes to ``on_error`` instead of crashing the app (re-raised without one).
    """

    def start() -> None:
        try:
            from jnius import autoclass

            activity = autoclass("org.kivy.android.PythonActivity").mActivity
            autoclass(f"{activity.getPackageName()}.ServiceSensing").start(activity, "")
        except Exception as exc:
            if on_error is None:
                raise
            on_error(exc)

    request_android_permissions(start)


def create_app(
    cfg: AppConfig, source: SensorSource | None, controller_factory: Callable[..., Any] = DeviceController, **controller_kwargs: Any
) -> Any:
    """Build the Kivy app object :class:`edge_client.app.window.FedHarApp` (imports Kivy: call after the options are parsed).

    ``controller_factory`` is :class:`~edge_client.app.controller.DeviceController` (sensing here) or
    :class:`~edge_client.app.service.RemoteController` (Android: the service senses).
    """
    from edge_client.app.window import FedHarApp  # imports Kivy

    return FedHarApp(cfg, source, controller_factory, controller_kwargs)


KIVY_ENVIRONMENT = {"KIVY_NO_ARGS": "1", "KIVY_LOG_MODE": "PYTHON"}
"""Kivy's environment for the app (``kivy.logger``, "Kivy's logging modes"): our options are not Kivy's, and
Kivy logs through Python's root logger alone, so every line is printed once and in one format."""

KIVY_CLIPBOARD = "sdl2,dummy"
"""Clipboard providers off Android (``KIVY_CLIPBOARD``): the SDL2 window's own, else none, instead of probing
xclip, xsel, dbus and gtk3 at start."""


class _CutBufferNote(logging.Filter):
    """Kivy's CRITICAL "Unable to find any valuable Cutbuffer provider" and its tracebacks, made one INFO line (X11's
    optional middle-click paste; Kivy probes it whatever the clipboard setting)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith("Cutbuffer: Unable to find"):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "Cutbuffer: no middle-click paste (install xclip or xsel to have it)", ()
        return True


def prepare_kivy(environ: dict[str, str] | os._Environ[str] | None = None, on_android: bool = False,
                 size: tuple[int, int] | None = None, fullscreen: bool = False) -> None:  # fmt: skip
    """Set Kivy's environment (:data:`KIVY_ENVIRONMENT`, :data:`KIVY_CLIPBOARD`, the window) before Kivy is imported.

    Values already set win, except the window's size and full-screen mode (the app's options;
    Android's window is always the screen).
    """
    env = os.environ if environ is None else environ
    for key, value in KIVY_ENVIRONMENT.items():
        env.setdefault(key, value)
    if not on_android:
        env.setdefault("KIVY_CLIPBOARD", KIVY_CLIPBOARD)
        env.update(kivy_environment(size, fullscreen))
    logging.getLogger("kivy").addFilter(_CutBufferNote())


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fedhar-app``; returns the exit status (:mod:`har_io.exit_codes`): 0 ok, 2 bad options,
    7 Kivy is not installed (the message names the extra to install)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = config_from_args(args, default_data_dir())
    except (ValueError, OSError) as exc:
        return fail(f"fedhar-app: {exc}")
    prepare_kivy(on_android=args.sensor == "android", size=cfg.window_size, fullscreen=cfg.fullscreen)
    try:
        import kivy  # noqa: F401  (Kivy's logger starts here, in the environment just set)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "kivy":
            raise
        return fail(f"fedhar-app: Kivy is not installed in {sys.prefix}; the app needs its extra: {install_hint('app')}",
                    Exit.MISSING_MODULE)
    try:
        if args.sensor == "android":  # sensing lives in the foreground service, which outlives the UI
            from edge_client.app.service import RemoteController

            create_app(cfg, None, RemoteController, start_service=start_android_service).run()
            return Exit.OK
        source = make_source(args.sensor, cfg.labels, args.replay_speed)
    except (ValueError, OSError) as exc:
        return fail(f"fedhar-app: {exc}")
    create_app(cfg, source).run()
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
