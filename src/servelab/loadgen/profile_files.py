"""The files a profile names (traces, empirical length files, its tokenizer.json) travel with it.

The master reads them once and sends them in the ``servelab_run`` message, keyed by the path
as the profile writes it; a worker on another host rebuilds the profile's folder around a copy
of the profile so every relative path resolves to the shipped text. A worker host therefore
needs only servelab, never the master's checkout. What travels is bounded (``MAX_SHIPPED_BYTES``).
"""
from __future__ import annotations

import posixpath
from pathlib import Path, PurePosixPath

from pydantic import BaseModel

from servelab.core.errors import ServelabError
from servelab.profiles import files

MAX_SHIPPED_BYTES = 16 * files.MIB


def referenced(profile) -> list[str]:
    """Every file path the profile names, as written (``file:`` anywhere, ``tokenizer:``)."""
    found: list[str] = []

    def walk(value) -> None:
        if isinstance(value, BaseModel):
            for name in type(value).model_fields:
                item = getattr(value, name)
                if name == "file" and isinstance(item, str):
                    found.append(item)
                else:
                    walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(profile)
    if profile.tokenizer is not None:
        found.append(profile.tokenizer)
    return list(dict.fromkeys(found))


def bundle(profile) -> dict:
    """``{"files": {path as written: text}, "error": None}`` for the RUN message. Past the size
    cap nothing is sent and ``error`` says why: a worker that has the files (``servelab run
    --workers N`` on one host) still runs; one that lacks them stops with that error."""
    shipped, sizes = {}, {}
    for ref in referenced(profile):
        path = profile.base_dir / ref
        try:
            shipped[ref] = files.read_text(path)
        except (OSError, ValueError) as exc:
            raise ServelabError(f"{profile.path}: {ref!r}: cannot be read to send it to the "
                                f"workers ({exc})") from None
        sizes[ref] = len(shipped[ref].encode("utf-8"))
    total = sum(sizes.values())
    if total <= MAX_SHIPPED_BYTES:
        return {"files": shipped, "error": None}
    listed = ", ".join(f"{ref} ({n / files.MIB:.1f} MiB)" for ref, n in sizes.items())
    return {"files": {}, "error": (
        f"{profile.path}: the files it names come to {total / files.MIB:.1f} MiB ({listed}); at "
        f"most {MAX_SHIPPED_BYTES // files.MIB} MiB travel to the workers with the profile: put "
        f"them on this worker host at the same paths, or cut the trace (load.trace.limits, or "
        f"fewer rows in the file)")}


def same_here(path: Path, text: str) -> bool:
    try:
        return files.read_text(path) == text
    except (OSError, ValueError):
        return False


def unpack(root: Path, profile_name: str, profile_text: str, shipped: dict[str, str]) -> Path:
    """Write the profile and its files under ``root`` so each path as written resolves to its
    text; returns the profile copy's path. ``../x`` paths get as many folder levels above the
    copy as they climb."""
    root = root.resolve()
    parts: dict[str, PurePosixPath] = {}
    for ref in shipped:
        norm = PurePosixPath(posixpath.normpath(ref.replace("\\", "/")))
        if norm.is_absolute():
            if same_here(Path(ref), shipped[ref]):
                continue
            raise ServelabError(
                f"the profile names {ref!r} by an absolute path, which is not on this worker "
                f"host (or differs from the master's): write it relative to the profile's "
                f"folder so it travels with the profile")
        parts[ref] = norm
    depth = max((sum(1 for p in n.parts if p == "..") for n in parts.values()), default=0)
    home = root.joinpath(*[f"up{i}" for i in range(depth)])
    home.mkdir(parents=True, exist_ok=True)
    copy = home / (Path(profile_name).name or "profile.yaml")
    copy.write_text(profile_text, encoding="utf-8")
    for ref, norm in parts.items():
        text = shipped[ref]
        target = (home / norm).resolve()
        if not target.is_relative_to(root):   # only what the master's message names, inside
            raise ServelabError(f"the master sent a profile file outside its folder: {ref!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return copy
