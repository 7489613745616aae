"""Distributed for real: the simulator, the Locust master and a worker each in a network namespace
of their own (addresses in 10.200.7.0/24 exist only there, joined by a bridge inside the
simulator's namespace; nothing is added to the host's own network). The worker also gets its own
hostname, a working folder of its own and the master's folder hidden under an empty tmpfs, so the
trace profile it runs can only have come with the master's RUN message; it even fetches the
locustfile from the master (``-f -``). Needs root and ``ip netns``; skipped without them."""
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager

import pytest

import servelab
from loadgen_helpers import HERE, ROOT, SIM_ARGS, dicts, query, server
from servelab.core import procs

pytestmark = pytest.mark.slow

NET = "10.200.7"
SIM_IP, MASTER_IP, WORKER_IP = f"{NET}.1", f"{NET}.2", f"{NET}.3"
MASTER_PORT = "5557"
WORKER_HOST = "servelab-worker-host"
TRACE_ROWS = 20

PROFILE = f"""\
name: netns_trace
description: A trace whose file exists only in the master's folder, with its own tokenizer.
endpoint: completions
model: auto
seed: 3
tokenizer: tok/tokenizer.json
classes:
  - name: conversation
load:
  trace:
    file: traces/azure_head.csv
    format: azure
    time_scale: 0.25
    max_in_flight: 8
    limits: {{max_requests: {TRACE_ROWS}}}
"""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@contextmanager
def _namespaces():
    tag = f"sl{os.getpid() % 100000}"
    sim_ns, master_ns, worker_ns = f"{tag}s", f"{tag}m", f"{tag}w"
    made: list[str] = []
    try:
        try:
            _ip("netns", "add", sim_ns)
        except (RuntimeError, OSError) as exc:
            pytest.skip(f"network namespaces are not available here (needs root and iproute2's "
                        f"`ip netns`): {exc}")
        made.append(sim_ns)
        for ns in (master_ns, worker_ns):
            _ip("netns", "add", ns)
            made.append(ns)
        for ns in made:
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", sim_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", sim_ns, "addr", "add", f"{SIM_IP}/24", "dev", "br0")
        _ip("-n", sim_ns, "link", "set", "br0", "up")
        for ns, addr, end in ((master_ns, MASTER_IP, "vm"), (worker_ns, WORKER_IP, "vw")):
            # Each pair is made inside the simulator's namespace and one end moved: the host's own
            # namespace never sees an interface or an address.
            _ip("-n", sim_ns, "link", "add", end, "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("-n", sim_ns, "link", "set", end, "master", "br0")
            _ip("-n", sim_ns, "link", "set", end, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        yield sim_ns, master_ns, worker_ns
    finally:
        for ns in reversed(made):   # deleting a namespace deletes the veth ends inside it
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not any(line.split()[0] in made for line in left.splitlines() if line.strip())


def _master_folder(tmp_path):
    home = tmp_path / "master"
    (home / "traces").mkdir(parents=True)
    (home / "tok").mkdir()
    lines = (ROOT / "traffic_profiles" / "traces" / "azure_conv_sample.csv").read_text()
    (home / "traces" / "azure_head.csv").write_text(
        "".join(lines.splitlines(keepends=True)[:TRACE_ROWS + 10]))
    shutil.copy(os.path.join(os.path.dirname(servelab.__file__), "data", "tokenizer.json"),
                home / "tok" / "tokenizer.json")
    (home / "netns_trace.yaml").write_text(PROFILE)
    return home


def _sim_requests(sim_ns: str, url: str) -> list[dict]:
    code = (f"import json, sys; sys.path.insert(0, {str(HERE)!r}); "
            f"from loadgen_helpers import sim_requests; print(json.dumps(sim_requests({url!r})))")
    out = subprocess.run(["ip", "netns", "exec", sim_ns, sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return json.loads(out)


def test_a_worker_on_another_host_runs_a_trace_it_only_got_from_the_master(tmp_path):
    master_dir = _master_folder(tmp_path)
    worker_dir = tmp_path / "worker-home"
    worker_dir.mkdir()
    res, spool = tmp_path / "res", tmp_path / "spool"
    res.mkdir()
    db, run_id = res / "t.duckdb", "netns-run"
    env = dict(os.environ, PYTHONUNBUFFERED="1", SERVELAB_HOME=str(ROOT))
    with _namespaces() as (sim_ns, master_ns, worker_ns):
        with server(["ip", "netns", "exec", sim_ns, sys.executable, "-m", "servelab.cli", "sim",
                     "--host", SIM_IP, "--port", "0", *SIM_ARGS], tmp_path, "sim") as url:
            assert url.startswith(f"http://{SIM_IP}:")
            master = procs.spawn("master", [
                "ip", "netns", "exec", master_ns, sys.executable, "-m", "locust",
                "-f", str(ROOT / "loadtests" / "locustfile.py"), "--headless", "--only-summary",
                "--host", url, "--profile", str(master_dir / "netns_trace.yaml"),
                "--db", str(db), "--run-id", run_id, "--status-file", str(res / "status.json"),
                "--spool-dir", str(spool), "--exit-code-on-error", "0",
                "--master", "--master-bind-host", MASTER_IP, "--master-bind-port", MASTER_PORT,
                "--expect-workers", "1", "--expect-workers-max-wait", "60"],
                tmp_path / "master.log", env=env, cwd=master_dir)
            # Another host: its own hostname, its own folder, and the master's folder not there.
            script = (f"hostname {WORKER_HOST} && mount -t tmpfs tmpfs {master_dir} && "
                      f"cd {worker_dir} && exec {sys.executable} -m locust -f - --worker "
                      f"--master-host {MASTER_IP} --master-port {MASTER_PORT}")
            worker = procs.spawn("worker", [
                "ip", "netns", "exec", worker_ns, "unshare", "--mount", "--uts",
                "--propagation", "private", "sh", "-c", script],
                tmp_path / "worker.log", env=env, cwd=worker_dir)
            try:
                code = master.wait(180)
                worker.wait(30)
            finally:
                worker.stop(10)
                master.stop(10)
            logs = ((tmp_path / "master.log").read_text()[-3000:] + "\n---- worker\n"
                    + (tmp_path / "worker.log").read_text()[-3000:])
            assert code == 0, logs
            seen = _sim_requests(sim_ns, url)
    (run,) = dicts(db, "SELECT status, flags, workers FROM runs")
    assert run["status"] == "completed" and run["workers"] == 1, (run, logs)
    assert "rows_lost" not in (run["flags"] or []), (run, logs)
    (w,) = dicts(db, "SELECT * FROM run_workers")
    assert (w["worker"], w["host"], w["status"]) == ("w0", WORKER_HOST, "finished"), w
    assert w["produced"] == w["stored"] == TRACE_ROWS and not w["in_flight_lost"], w
    rows = query(db, "SELECT worker, error_kind, request_id FROM requests")
    assert len(rows) == TRACE_ROWS and {(r[0], r[1]) for r in rows} == {("w0", None)}, rows
    # every request the simulator saw is one stored row (and nothing else reached it)
    assert len(seen) == TRACE_ROWS, seen[:3]
    # the worker ran the copy rebuilt from the message, not the master's files
    copy = spool / run_id / "profile"
    assert (copy / "netns_trace.yaml").read_text() == PROFILE
    assert (copy / "traces" / "azure_head.csv").is_file()
    assert (copy / "tok" / "tokenizer.json").is_file()
