"""The run's identity and its ``runs`` row: id, target, model (resolved from the target when the
profile says ``auto``), seed, prompt salt, the host and library versions, the variant's GPUs."""
from __future__ import annotations

import logging
import os
import platform
import secrets
import socket
import sys
import time

from servelab import __version__
from servelab.core.errors import ServelabError
from servelab.core.timeouts import HTTP_PROBE_S
from servelab.loadgen import profile_files
from servelab.loadgen.options import Settings
from servelab.store.rows import ClassRow, RunRow, class_rows

log = logging.getLogger("servelab.loadgen")


class RunRecord:
    def __init__(self, run_id: str, settings: Settings, profile, shaped: bool, target: str,
                 workers: int):
        self.run_id = run_id
        self.settings = settings
        self.profile = profile
        self.shaped = shaped
        self.target = target
        self.workers = workers        # 0: a local run, no worker processes
        self.started_unix = time.time()
        # model_problem: what /v1/models answered when it named no model (an endpoint event)
        self.model, self.model_problem = _resolve_model(settings, profile, target)
        self.salt = secrets.token_hex(3) if profile.salt else None
        self.seed = profile.seed if settings.seed is None else settings.seed
        self.host_info = _host_info()
        variant = _variant(settings.variant)
        self.gpus = variant.gpus if variant is not None else None
        self.request_id_field = _request_id_field(settings, variant)
        self.profile_text = profile.path.read_text(encoding="utf-8")
        # A worker may be another host without the master's files: they travel in the RUN message.
        self.profile_files = profile_files.bundle(profile) if workers else {}

    def announcement(self, slots: dict) -> dict:
        """What every worker needs to take part (the RUN message)."""
        return {"run_id": self.run_id, "slots": slots, "settings": self.settings.as_json(),
                "profile_path": str(self.profile.path), "profile_text": self.profile_text,
                "profile_files": self.profile_files,
                "seed": self.seed, "salt": self.salt, "model": self.model,
                "target": self.target, "request_id_field": self.request_id_field}

    def row(self, status: str, notes: str | None = None,
            extra_settings: dict | None = None) -> RunRow:
        p, s = self.profile, self.settings
        settings = dict(s.as_json(), seed=self.seed, salt=self.salt, shaped=self.shaped)
        settings.update(extra_settings or {})
        return RunRow(
            run_id=self.run_id, started_unix=self.started_unix,
            finished_unix=time.time() if status != "running" else None,
            profile_name=p.name, profile_path=str(p.path), profile_text=self.profile_text,
            load_kind="manual" if s.mode == "manual" else p.load.kind,
            target=self.target, variant=s.variant or None,
            hardware=s.hardware or None, model=self.model, gpus=self.gpus, tags=s.tags,
            servelab_version=__version__, workers=self.workers, status=status,
            host_info=self.host_info, flags=[], settings=settings, notes=notes)

    def class_rows(self) -> list[ClassRow]:
        return class_rows(self.run_id, self.profile)


def _resolve_model(settings: Settings, profile, target: str):
    """(the model name, None) or (None, the TokenCountError of /v1/models)."""
    from servelab.profiles.tokens import TokenCountError, resolve_model

    model = settings.served_model or (profile.model if profile.model != "auto" else None)
    if model is None:
        try:
            model = resolve_model(target, HTTP_PROBE_S)
        except TokenCountError as exc:  # the requests will show what the server says
            log.warning("servelab: %s; sending requests with no model name", exc)
            return None, exc
    return model, None


def _host_info() -> dict:
    # Read on the event loop: platform.platform() may start a subprocess, which gevent only
    # allows there, not in the database thread.
    import duckdb
    import locust

    return {"hostname": socket.gethostname(), "cpus": os.cpu_count(),
            "python": sys.version.split()[0], "platform": platform.platform(),
            "locust": locust.__version__, "duckdb": duckdb.__version__}


def _request_id_field(settings: Settings, variant) -> str | None:
    """The body field that names a request for the target's kind (SGLang: ``rid``), or None
    (vLLM reads the X-Request-Id header every request carries). An unknown --server-kind is
    the user's mistake, said before any request is sent."""
    from servelab.specs.server_kinds import KINDS, tracing_of

    if settings.server_kind and settings.server_kind not in KINDS:
        raise ServelabError(f"--server-kind {settings.server_kind!r}: not a server kind servelab "
                            f"knows; use one of {', '.join(KINDS)} (or leave it out: the "
                            "variant's, else vllm)")
    name = settings.server_kind or (variant.kind.name if variant is not None else None)
    tracing = tracing_of(KINDS[name]) if name else None
    return getattr(tracing, "REQUEST_ID_FIELD", None)


def _variant(name: str):
    """The variant file ``name`` stands for, or None (none given, or a name that is only a
    label)."""
    if not name:
        return None
    try:
        from servelab.specs.variants import load_variant

        return load_variant(name)
    except Exception:  # noqa: BLE001 - a variant name that is only a label
        return None
