"""The Compose services of a prefill/decode-disaggregated variant (``specs.pd``).

Each instance is a vLLM server on its own GPU, started with the variant's ``serve_args`` (their
``--kv-transfer-config`` is the same on both roles) and told the host name the other instances
reach its NIXL side channel on (``VLLM_NIXL_SIDE_CHANNEL_HOST``; the default, localhost, would
point a decode container at itself). In front of them runs vLLM's own proxy,
``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``, on the vLLM image (it needs only
FastAPI, httpx and uvicorn, which the image has). vLLM's image does not ship its tests folder,
so the file is mounted from ``docker/pd/`` (docker/pd/README.md says how to fetch the copy that
matches the image).
"""
from __future__ import annotations

from servelab.specs.variants import Variant

PROXY_FILE = "./docker/pd/toy_proxy_server.py"
PROXY_IN_CONTAINER = "/opt/pd/toy_proxy_server.py"
PROXY_HEALTH = "/healthcheck"  # the toy proxy's own health route (it has no /health)
SIDE_CHANNEL_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"


def proxy_name(variant: Variant) -> str:
    return "proxy-" + variant.name.replace("_", "-")


def role_suffix(variant: Variant, instance: int) -> str:
    """``prefill-0``, ``decode-0``: the role in the service name, so logs say which is which."""
    return f"{variant.pd.role(instance)}-{variant.pd.index_in_role(instance)}"


def side_channel_env(base_env: dict, host: str) -> dict:
    # A service's own `environment` replaces the merged block's, so the block's keys come along.
    return {**base_env, SIDE_CHANNEL_ENV: host}


def proxy_service(variant: Variant, servers: list[str], port: int, published: str) -> dict:
    """The proxy: the kind's image with python3 as entrypoint, every prefill then every decode
    instance by service name, and a health check on its ``/healthcheck``."""
    prefill = servers[:variant.pd.prefill]
    decode = servers[variant.pd.prefill:]
    probe = (f"import urllib.request; urllib.request.urlopen("
             f"'http://127.0.0.1:{port}{PROXY_HEALTH}', timeout=4)")
    return {
        "image": variant.kind.image,
        "entrypoint": ["python3", PROXY_IN_CONTAINER],
        "profiles": [variant.name],
        "command": ["--host", "0.0.0.0", "--port", str(port),
                    "--prefiller-hosts", *prefill, "--prefiller-ports", *[str(port)] * len(prefill),
                    "--decoder-hosts", *decode, "--decoder-ports", *[str(port)] * len(decode)],
        "volumes": [f"{PROXY_FILE}:{PROXY_IN_CONTAINER}:ro"],
        "ports": [published],
        "depends_on": {s: {"condition": "service_healthy"} for s in servers},
        "healthcheck": {"test": ["CMD", "python3", "-c", probe],
                        "interval": "10s", "timeout": "5s", "retries": 6},
    }
