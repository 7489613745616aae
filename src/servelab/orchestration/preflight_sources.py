"""Which GPUs a preflight judges a variant against: named hardware from servers/hardware, a saved
``nvidia-smi`` CSV, or ``nvidia-smi`` itself, with the interconnect from a saved ``nvidia-smi
topo -m`` or a live one. ``servelab preflight``, ``servelab verify`` and the matrix all start here;
the checks themselves are ``preflight.run_preflight``'s."""
from __future__ import annotations

from servelab.orchestration import preflight as pf
from servelab.orchestration.gpus import read_gpus, read_topology
from servelab.specs.variants import Variant


def live_server(url: str | None, label: str | None = None) -> pf.LiveServer:
    """What a running server uses, from its /metrics (``label`` names it when there is no URL)."""
    from servelab.orchestration.serverlog import metrics_missing, parse_metrics, read_metrics

    if not url:
        return pf.LiveServer(label or "the server under test")
    text, outcome, detail = read_metrics(url)
    source = url.rstrip("/") + "/metrics"
    if text is None:   # the label says what came back instead (a login page, a timeout...)
        return pf.LiveServer(f"{url.rstrip('/')} (no usable /metrics: "
                             f"{metrics_missing(url, outcome, detail)})")
    return pf.LiveServer.from_cache_configs(source, parse_metrics(text).cache_configs)


def preflight_report(variant: Variant, gpus_file=None, topology_file=None, hardware=None,
                     count=None, profile=None, *, source: str | None = None,
                     probe_topology: bool = True, url: str | None = None,
                     server_up: bool = False) -> pf.PreflightReport:
    """Preflight on ``hardware`` (``count`` of them, default as many as the variant needs), or
    on the GPUs of ``gpus_file`` (None: run nvidia-smi). With live GPUs and no topology file,
    ``probe_topology`` runs ``nvidia-smi topo -m`` when the variant would span several GPUs.
    ``url`` (or ``server_up``): the variant is already served there, on these GPUs."""
    links = read_topology(topology_file) if topology_file else None
    if hardware:
        gpus = pf.gpus_from_hardware(hardware, count or variant.gpus)
        source = source or f"--hardware {hardware}"
    else:
        gpus = read_gpus(gpus_file)
        source = source or gpus_file or "nvidia-smi"
        if probe_topology and gpus_file is None and links is None and len(gpus) > 1:
            links = read_topology(None)
    lengths = pf.profile_lengths(profile) if profile else None
    server = live_server(url) if (url or server_up) else None
    return pf.run_preflight(variant, gpus, source, links, lengths, server)


def matrix_preflight(variant: Variant, backend: str, hardware: str, profile: str,
                     gpus_file=None, topology_file=None,
                     url: str | None = None) -> pf.PreflightReport | None:
    """The matrix's preflight for one variant: simulated backends are judged on the simulated
    GPU; local and compose servers on the real GPUs; an external server, on unknown hardware,
    only when ``gpus_file`` says what it runs on (else None: nothing to check against)."""
    if backend in ("sim", "predict"):
        return preflight_report(variant, hardware=hardware, profile=profile,
                                source=f"simulated {hardware}")
    if gpus_file or backend in ("local", "compose"):
        # An external server is up already: the memory it holds is the server under test's.
        return preflight_report(variant, gpus_file, topology_file, profile=profile,
                                probe_topology=False, url=url if backend == "external" else None,
                                server_up=backend == "external")
    return None
