"""The status page ``serve`` starts beside its loop, the monitor session it reads the federation through, the blob store it serves."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coordinator.config import CoordinatorConfig
from coordinator.server.settings import ServerSettings
from har_io.broker_config import BrokerConfig

log = logging.getLogger("fedhar.serve")


def monitor_broker(server: ServerSettings, broker: BrokerConfig, credentials_dir: str | None) -> BrokerConfig | None:
    """Broker settings of the status page's monitor session, or None when there is no usable monitor account.

    The password comes from ``[server] monitor_password_file``, else systemd's credential ``monitor`` in
    ``credentials_dir``, else ``[server] broker_dir``; the user is ``[server] monitor_user``. Without
    ``broker_dir`` (a development broker) the coordinator's settings are used under another client id.
    With ``broker_dir`` the coordinator's account is never borrowed (one session per user name: the two
    would take turns for ever); None is returned, logged with the fix.
    """
    sources: list[Path] = []
    if server.monitor_password_file:
        sources.append(Path(server.monitor_password_file).expanduser())
    elif credentials_dir and (Path(credentials_dir) / "monitor").is_file():
        sources.append(Path(credentials_dir) / "monitor")
    for path in sources:
        try:
            password = path.read_text().strip()
        except OSError as exc:
            log.error("status page: the monitor password file %s is unreadable (%s); no presence on the page", path, exc.strerror or exc)
            return None
        if not password:
            log.error("status page: the monitor password file %s is empty; no presence on the page", path)
            return None
        return dataclasses.replace(broker, username=server.monitor_user, password=password)
    if not server.broker_dir:
        return broker
    try:
        from coordinator.server.broker_admin import BrokerAdmin

        user, password = BrokerAdmin(Path(server.broker_dir), reload="none").monitor_credentials()
    except (ImportError, RuntimeError, OSError) as exc:
        log.error(
            "status page: the monitor account is not usable (%s); give the server its password: "
            "sudo install -m 600 %s/credentials/%s.password /etc/fedhar/monitor.password (the unit loads it as the credential "
            "'monitor'), or set [server] monitor_password_file; the page shows no presence until then",
            exc, server.broker_dir, server.monitor_user,
        )  # fmt: skip
        return None
    return dataclasses.replace(broker, username=user, password=password)


def page_blob_store(cfg: CoordinatorConfig, server: ServerSettings, refused: Callable[[str], bool] | None = None) -> Any:
    """The folder blob store the status page serves under ``/blobs/`` (transport blobs, folder store, a page); else None.

    URLs start with ``[transport] public_url``, else the page's address once bound; devices ``refused``
    names may not write. Raises ValueError for a wildcard ``http_bind`` without ``public_url``.
    """
    t = cfg.transport
    if t.kind != "blobs" or t.store != "folder" or not server.http_port:
        return None
    try:
        from coordinator.transport.folder_store import FolderBlobStore, load_secret
    except ImportError:  # no web libraries: the page is not served either
        return None
    if not t.public_url and server.http_bind in ("0.0.0.0", "::", ""):
        raise ValueError(f"[server] http_bind = {server.http_bind!r} serves the blob store on every address: "
                         "set [transport] public_url (e.g. 'http://homeserver.lan:8765') so devices know where to fetch")  # fmt: skip
    return FolderBlobStore(cfg.run_dir / "blobs", t.public_url, load_secret(cfg.run_dir / "blob-secret"), refused=refused)


@dataclasses.dataclass(frozen=True)
class PageFeeds:
    """What the serving loop tells the page: the next start, why no round runs, the server's health problems."""

    next_start: Callable[[], float | None]
    waiting: Callable[[], str | None]
    problems: Callable[[], list[str]]


def start_status_page(server: ServerSettings, cfg: CoordinatorConfig, data_dir: Path, stall_after_s: float, feeds: PageFeeds,
                      blob_store: Any = None) -> tuple[Any, Any]:  # fmt: skip
    """Start the status page in a thread unless ``[server] http_port`` is 0; ``(page, monitor)``, each None when absent.

    Without the web libraries it is logged and skipped. Raises RuntimeError if the port is taken.
    """
    if server.http_port == 0:
        return None, None
    try:
        from coordinator.server.monitor import Monitor
        from coordinator.server.web import ServerView
        from coordinator.server.web import start_status_page as start_page
    except ImportError as exc:
        log.warning("no status page: %s (install the coordinator extra)", exc)
        return None, None
    from coordinator.server.registry import Registry
    from coordinator.state import RunState
    from har_models.wire.topics import Topics

    broker = monitor_broker(server, cfg.broker, os.environ.get("CREDENTIALS_DIRECTORY"))
    monitor: Any = None
    page: Any = None
    try:
        if broker is not None:
            monitor = Monitor(Topics(cfg.federation), broker, client_name=f"fedhar-monitor-{cfg.federation}")
            monitor.start(wait_s=None)
        view = ServerView(name=server.name, run_state=RunState(cfg.run_dir), registry=Registry(data_dir), monitor=monitor,
                          next_start=feeds.next_start, waiting=feeds.waiting, stall_after_s=stall_after_s,
                          broker_dir=Path(server.broker_dir) if server.broker_dir else None, problems=feeds.problems,
                          keep_versions=server.keep_versions)  # fmt: skip
        blob_routes: list[Any] = []
        if blob_store is not None:
            from coordinator.transport.folder_store import blob_app

            blob_routes = list(blob_app(blob_store).routes)
        page = start_page(view, server.http_bind, server.http_port, server.token, blob_routes=blob_routes)
        if blob_store is not None and not cfg.transport.public_url:
            host = server.http_bind
            blob_store.base_url = f"http://{f'[{host}]' if ':' in host else host}:{page.port}"
        if blob_store is not None:
            log.info("blob transport: models and uploads in %s, served at %s/blobs/", blob_store.folder, blob_store.base_url)
    except BaseException:  # the port taken, or interrupted (SIGINT) while starting: nothing started is left running
        if page is not None:
            page.stop()
        if monitor is not None:
            monitor.stop()
        raise
    log.info("status page on http://%s:%d/", server.http_bind, page.port)
    return page, monitor
