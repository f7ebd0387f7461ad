"""The home server's status site: the page, its JSON API, ``/metrics`` and ``/healthz`` (Starlette under uvicorn).

Read-only. The package map, by job:

* :mod:`~coordinator.server.web.view` — :class:`ServerView`, the one view model: what the site
  shows, read from the server database, the run's database and the broker's monitor account;
* :mod:`~coordinator.server.web.fold` — what it keeps of the round records, folded as rounds complete
  (the shared model's quality per version among it);
* :mod:`~coordinator.server.web.devices`, :mod:`~coordinator.server.web.health`,
  :mod:`~coordinator.server.web.certs` — each device's row, the reasons the federation cannot make progress (disk, stuck round,
  unreadable files), the broker's certificates; each device's harm counts and the versions' marks
  come from :mod:`coordinator.server.harm` and :mod:`coordinator.server.version_marks`, which
  ``fedhar-coordinator devices`` and ``versions`` can use without the web libraries;
* :mod:`~coordinator.server.web.series` — the chart series; the SVG is drawn by :mod:`coordinator.server.charts`;
* :mod:`~coordinator.server.web.page` — the view's answers arranged for the templates
  (``coordinator/server/templates/``, Jinja2 with autoescaping, :mod:`coordinator.server.templating`);
* :mod:`~coordinator.server.web.routes` — the routes, the token gate and the headers.

The thread that serves it is :class:`har_io.web_thread.WebServer` (the blob store uses it too).
"""

from coordinator.server.web.devices import sensing_json
from coordinator.server.web.page import render_page
from coordinator.server.web.routes import TokenGate, make_app, start_status_page, to_json_text
from coordinator.server.web.view import ServerView
from har_io.web_thread import BindRefused, WebServer, check_bind, is_loopback

__all__ = ["BindRefused", "ServerView", "TokenGate", "WebServer", "check_bind", "is_loopback", "make_app", "render_page",
           "sensing_json", "start_status_page", "to_json_text"]
