"""servelab's face in Locust's web UI and beside it (master or local process only).

- ``guard``: the start form (both modes, the plan described) and ``/swarm``'s checks: only the
  form's own fields, a profile that loads, a target that answers; the error shown in the UI.
- ``llm_tab``: the LLM tab (live charts from the master's live window) and truthful labels on
  Locust's stats table, added to Locust's own UI page.
- ``api``: the JSON API under ``/servelab/api`` (runs, a run's stages, the live window, the
  current run's status, read-only queries for the CLI while the master holds the database);
  served by Locust's web UI, or by a small server of its own when Locust runs headless.
"""
from __future__ import annotations


def install(environment, master) -> None:
    """Mount everything on Locust's web UI (``environment.web_ui``: master or local only)."""
    from . import api, guard, llm_tab

    web_ui = environment.web_ui
    api.mount(web_ui, master)
    guard.install(web_ui, master)
    llm_tab.install(web_ui, master)


def serve_headless(environment, master) -> None:
    """Headless (``servelab run``): the JSON API on a server of its own (``--api-port``)."""
    from . import api

    api.serve_headless(environment, master)
