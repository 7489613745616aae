"""The LLM tab in Locust's own web UI, without forking it.

Locust draws an extended tab for each ``template_args["extended_tabs"]`` entry; servelab's
script (static/llm_tab.js) fills that tab's panel with live charts read from the JSON API's
``/servelab/api/live`` (``Collector.live_view``). The script reaches the page through Locust's own
index.html: copied at start-up from the installed Locust's build into a folder of this process,
with servelab's tags added before ``</body>``, and that folder becomes the app's template folder
(Locust's ``/assets`` route falls back to its own build for everything else). The static files
are served under ``/servelab/static/`` behind the UI's login when ``--web-login`` is on.
"""
from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
from pathlib import Path

from flask import send_from_directory
from locust.html import DEFAULT_BUILD_PATH

from servelab.core.errors import ServelabError

log = logging.getLogger("servelab.loadgen")
STATIC = Path(__file__).with_name("static")
TAB = {"title": "LLM", "key": "llm"}
# Relative, as Locust's own asset links: they resolve under --web-base-path too.
TAGS = ('<link rel="stylesheet" href="./servelab/static/uPlot.min.css">\n'
        '<link rel="stylesheet" href="./servelab/static/llm_tab.css">\n'
        '<script src="./servelab/static/uPlot.iife.min.js"></script>\n'
        '<script src="./servelab/static/llm_tab.js"></script>\n')
ENDPOINT = "servelab_static"


def install(web_ui, master) -> None:
    """Add the LLM tab to ``web_ui`` (once; a second call changes nothing)."""
    app = web_ui.app
    if ENDPOINT in app.view_functions:
        return
    tabs = web_ui.template_args.setdefault("extended_tabs", [])
    if TAB not in tabs:
        tabs.append(TAB)
    _use_page(app, _page_folder(app.template_folder or DEFAULT_BUILD_PATH))
    base = (getattr(web_ui.environment.parsed_options, "web_base_path", None) or "").rstrip("/")

    @web_ui.auth_required_if_enabled
    def servelab_static(name: str):
        return send_from_directory(STATIC, name, max_age=60)

    app.add_url_rule(f"{base}/servelab/static/<path:name>", ENDPOINT, servelab_static)


def _page_folder(build: str) -> Path:
    """A folder holding Locust's index.html with servelab's tags; removed when the process ends."""
    source = Path(build) / "index.html"
    try:
        page = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise ServelabError(f"{source}: Locust's web UI page cannot be read ({exc}); reinstall "
                            f"locust (pip install -e .)") from exc
    if "</body>" not in page:
        raise ServelabError(f"{source}: no </body> in Locust's web UI page; this Locust build "
                            f"is not one servelab knows (locust==2.47.0 is)")
    folder = Path(tempfile.mkdtemp(prefix="servelab-ui-"))
    atexit.register(shutil.rmtree, folder, True)
    (folder / "index.html").write_text(page.replace("</body>", TAGS + "</body>", 1),
                                       encoding="utf-8")
    return folder


def _use_page(app, folder: Path) -> None:
    app.template_folder = str(folder)
    # Flask caches the loader it built from the old folder, and Jinja the templates it loaded.
    app.__dict__.pop("jinja_loader", None)
    cache = getattr(app.jinja_env, "cache", None)
    if cache is not None:
        cache.clear()
