"""``servelab calibrate``: fit the simulator's cost coefficients to a running server.

The probes (``calibrate_probes``) give, per probe, the server's own total prefill time and total
decode time (vLLM's request_prefill/decode_time histograms, differenced around the probe). The
fit needs what the cost model would have said for the same probe, so each probe is replayed once
through the simulator's real ``Engine`` (its scheduler, chunked prefill and token budget): that
fixes which requests shared which step (the schedule of requests that all wait at once does not
depend on step durations) and records every step's ``BatchShape``. A measured total is then a sum
of step times, ``sum_s w_s * T(shape_s; theta)``, with ``T`` the one cost formula
(``sim.engine.cost_model``). Least squares on the relative errors, over the logarithms of the
fitted coefficients (Levenberg-Marquardt, numpy), finds ``theta``; the residual of every probe
goes into the calibration file so a reader sees how well the roofline fits that server.
"""
from __future__ import annotations

import dataclasses
import datetime
import math
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.core.errors import ServelabError
from servelab.orchestration.calibrate_probes import Measured, ProbeClient, probe_set
from servelab.sim.engine.cost_model import priced
from servelab.specs.cost_calibration import (CALIBRATION_FORMAT, MECHANISMS, OPTIONAL_PARAMS,
                                             CostParams, applies_to, calibration_dir,
                                             find_calibration)

# What the probes can separate; the rest keep their defaults (docs/simulator.md says why).
FITTED = ("eta_bw", "eta_compute", "eta_attn", "t_cpu_s", "t_seq_s")
LATE_RETRIES = 4   # reruns of a probe whose requests missed the blocker's step


@dataclass
class Replayed:
    """One probe through the engine: its steps' shapes and each total as step weights."""
    shapes: list
    weights: dict[str, np.ndarray]      # metric -> weight of each step in its total
    decode_steps: int                   # sum over requests of (output tokens - 1)
    first_steps: list[int]              # per prompt: the step that returns its first token


class _ShapeLog:
    """Stands in the engine's place of its cost model to keep each step's batch summary."""

    def __init__(self, inner):
        self.inner, self.shapes = inner, []

    def step_time(self, b):
        self.shapes.append(dataclasses.replace(b))
        return self.inner.step_time(b)


def replay(config, m: Measured) -> Replayed:
    """The probe's schedule: the blocker (if any) alone in the first step, then every request
    waiting together, as the probe client arranges on the server."""
    from servelab.sim.engine.balancer import make_engines

    engine = make_engines(config, 0, count=1, cost=CostParams())[0]
    log = engine.cost = _ShapeLog(engine.cost)
    output = [1] * (1 if m.blocker else 0) + [m.probe.output] * m.probe.batch
    seqs = []
    first: dict[str, int] = {}
    last: dict[str, int] = {}

    def run_until(done) -> None:
        while not done():
            k = len(log.shapes)  # the step's index is its time: the schedule ignores durations
            out = engine.step(float(k))
            if len(log.shapes) == k:
                raise ServelabError(f"calibrate: probe {m.probe.name} stalls in the replay "
                                    "(no step could run; the KV cache is too small for it)")
            for ev in out.events:
                first.setdefault(ev.request_id, k)
                last[ev.request_id] = k

    for i, (prompt, n) in enumerate(zip(m.prompts, output)):
        seqs.append(engine.add_request(f"c{i}", prompt, n, min_tokens=n, ignore_eos=True))
        if i == 0 and m.blocker:  # the blocker's step runs before the others arrive
            run_until(lambda: "c0" in first)
    run_until(lambda: not engine.has_unfinished())
    n_steps = len(log.shapes)
    prefill, decode = np.zeros(n_steps), np.zeros(n_steps)
    for seq in seqs:
        rid = seq.request_id
        start = int(seq.first_scheduled_time)
        prefill[start:first[rid] + 1] += 1
        decode[first[rid] + 1:last[rid] + 1] += 1
    return Replayed(log.shapes, {"prefill_s": prefill, "decode_s": decode},
                    sum(n - 1 for n in output), [first[s.request_id] for s in seqs])


def on_schedule(m: Measured, rp: Replayed, step_s: float) -> bool:
    """Whether the server ran the probe as replayed, from each request's first chunk: sorted,
    the chunks the replay puts in one step leave no gap of half a step (``step_s``, the shortest
    step seen: decode_b1's ITL), and each later step's come at least half a step after. A request
    that arrived after its step began, or a blocker that shared a step, breaks one of the two;
    the client reading 64 streams one after another does not (its reads are ~50 us apart)."""
    if not m.blocker:
        return True
    groups: dict[int, list[float]] = {}
    for t, k in zip(m.first_chunk, rp.first_steps):
        if t is None:
            return False
        groups.setdefault(k, []).append(t)
    tol = step_s / 2
    ordered = [sorted(v) for _, v in sorted(groups.items())]
    return (all(b - a <= tol for g in ordered for a, b in zip(g, g[1:]))
            and all(b[0] - a[-1] >= tol for a, b in zip(ordered, ordered[1:])))


def predicted(config, theta: dict, replays: list[Replayed]) -> np.ndarray:
    """Every probe's totals (prefill_s, decode_s where it has decode) under coefficients theta."""
    model = priced(config, dataclasses.replace(CostParams(), **theta))
    out = []
    for r in replays:
        t = np.array([model.step_time(b) for b in r.shapes])
        out.append(float(r.weights["prefill_s"] @ t))
        if r.decode_steps:
            out.append(float(r.weights["decode_s"] @ t))
    return np.array(out)


def measured_totals(ms: list[Measured]) -> np.ndarray:
    out = []
    for m in ms:
        out.append(m.deltas["prefill_s"])
        if m.probe.output > 1:
            out.append(m.deltas["decode_s"])
    return np.array(out)


def fit(config, ms: list[Measured], replays: list[Replayed], iterations: int = 40) -> dict:
    """Levenberg-Marquardt on log-coefficients, relative residuals; returns the fitted values."""
    y = measured_totals(ms)
    if np.any(y <= 0):
        raise ServelabError("calibrate: a probe's server-side time is zero; the target's /metrics "
                            "did not count the probe's requests (another client, or a restart?)")
    x = np.log([getattr(CostParams(), n) for n in FITTED])

    def resid(xv):
        theta = dict(zip(FITTED, np.exp(xv)))
        if theta["eta_bw"] > 1 or theta["eta_compute"] > 1 or theta["eta_attn"] > 1:
            return np.full_like(y, 1e3)  # efficiencies above peak are not physics
        return predicted(config, theta, replays) / y - 1

    r, lam = resid(x), 1e-3
    for _ in range(iterations):
        h = 1e-5
        J = np.column_stack([(resid(x + h * e) - r) / h for e in np.eye(len(x))])
        A, g = J.T @ J, J.T @ r
        step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)
        r_new = resid(x + step)
        if r_new @ r_new < r @ r:
            x, r, lam = x + step, r_new, lam / 3
            if np.max(np.abs(step)) < 1e-7:
                break
        else:
            lam *= 4
    return dict(zip(FITTED, (float(v) for v in np.exp(x))))


def residual_rows(config, ms: list[Measured], replays: list[Replayed], theta: dict) -> list[dict]:
    """Per probe: server-side prefill ms per request and decode ms per step, measured and fitted."""
    pred = predicted(config, theta, replays)
    rows, k = [], 0
    for m, rp in zip(ms, replays):
        n = len(m.prompts)
        pairs = [("prefill_ms_per_request", m.deltas["prefill_s"], float(pred[k]), n)]
        k += 1
        if rp.decode_steps:
            pairs.append(("decode_ms_per_step", m.deltas["decode_s"], float(pred[k]), rp.decode_steps))
            k += 1
        for metric, meas, fitted, per in pairs:
            rows.append({"probe": m.probe.name, "isolates": m.probe.isolates, "metric": metric,
                         "measured": round(1e3 * meas / per, 4),
                         "fitted": round(1e3 * fitted / per, 4),
                         "error": round(fitted / meas - 1, 4),
                         "client_itl_ms": _r(m.client_itl_ms), "late": m.late})
    return rows


def acceptance(ms: list[Measured]) -> list[float] | None:
    """Conditional acceptance of each draft position from vLLM's spec-decode counters."""
    drafts = sum(m.deltas.get("spec_drafts", 0.0) for m in ms)
    width = max((len(m.per_pos) for m in ms), default=0)
    if drafts <= 0 or width == 0:
        return None
    per_pos = [sum(m.per_pos[i] for m in ms if i < len(m.per_pos)) for i in range(width)]
    out, prev = [], drafts
    for v in per_pos:
        out.append(round(v / prev, 4) if prev > 0 else 0.0)
        prev = v
    return out


def _r(v):
    return None if v is None else round(v, 3)


def default_out(hardware: str, model: str, variant: str) -> Path:
    return calibration_dir() / f"{hardware}-{model.replace('/', '--')}-{variant}.yaml"


def calibrate(variant, hardware: str, target: str, out: Path | None = None,
              repeat: int = 1, output_tokens: int = 32, say=print) -> Path:
    """Probe ``target``, fit, write the calibration file; returns its path."""
    import yaml

    from servelab.specs.engine_config import build_kind_engine_config

    config = build_kind_engine_config(hardware, variant.model, variant.serve_args, variant.kind)
    if config.data_parallel_size > 1 or variant.instances > 1:
        raise ServelabError(f"--variant {variant.name}: DP={config.data_parallel_size}, "
                            f"instances={variant.instances}; calibrate one engine (a DP=1, one-"
                            "instance variant): the ranks share its coefficients")
    client = ProbeClient(target)
    probes = probe_set(config.max_num_batched_tokens, config.max_model_len, config.max_num_seqs,
                       output_tokens)
    t0 = time.monotonic()
    ms, replays = _measure(config, client, probes, repeat, say)
    probe_s = time.monotonic() - t0
    on_time = [i for i, m in enumerate(ms) if not m.late] or list(range(len(ms)))
    theta = fit(config, [ms[i] for i in on_time], [replays[i] for i in on_time])
    rows = residual_rows(config, ms, replays, theta)
    doc = _calibration_doc(variant, config, target, client, theta, rows, len(on_time), probe_s)
    carry_recorded_terms(doc, config)
    acc = acceptance(ms)
    if config.speculative is not None and acc:
        doc["spec_decode"] = {"method": config.speculative.method, "acceptance": acc}
    path = Path(out) if out else default_out(config.hardware.name, config.model.hf_id, variant.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# Written by `servelab calibrate --variant {variant.name} --hardware "
              f"{config.hardware.name}`: the simulator's cost coefficients fitted to {target}'s\n"
              "# own /metrics (docs/simulator.md, 'Calibrating against a real server').\n")
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=100))
    say(f"fitted {', '.join(f'{k}={v:.4g}' for k, v in theta.items())}; residuals rms "
        f"{doc['fit']['rms_error']:.1%}, max {doc['fit']['max_abs_error']:.1%} over "
        f"{doc['fit']['totals']} totals; {probe_s:.1f} s of probes")
    return path


def carry_recorded_terms(doc: dict, config) -> None:
    """Keep what probes cannot measure: the calibration in force for this scope may price the
    host side of a step, the idle engine's fixed cost and the API server's CPU from a run
    recorded under load (its ``recorded_run``); a new probe fit keeps those coefficients, each
    with its mechanism, and names the file they came from."""
    old = find_calibration(config)
    if old is None:
        return
    kept = {k: getattr(old.params, k) for k in sorted(OPTIONAL_PARAMS) if getattr(old.params, k)}
    if kept:
        doc["params"].update(kept)
        doc["mechanisms"].update({k: MECHANISMS[k] for k in kept})
        doc["recorded_run"] = {"kept_from": old.path.name, "kept": list(kept)}


def _measure(config, client: ProbeClient, probes, repeat: int, say) -> tuple[list, list]:
    """Each probe ``repeat`` times, with the engine's replay of what it should have scheduled."""
    blocker = min(config.max_num_batched_tokens, config.max_model_len - 1, 4096)
    ms, replays, step_s, lead_s = [], [], None, 0.005
    for rep in range(repeat):
        for probe in probes:
            # A busy host (client or server) can miss the blocker's step: a probe the server did
            # not schedule as replayed would be fitted against the wrong steps. Again, a few
            # times; one still late is left out of the fit and marked in its residuals.
            for _ in range(1 + LATE_RETRIES):
                m = client.run(probe, blocker, lead_s)
                rp = replay(config, m)
                m.late = m.late or (step_s is not None and not on_schedule(m, rp, step_s))
                if not m.late:
                    break
            if probe.batch == 1 and m.client_itl_ms:
                step_s = min(step_s or math.inf, m.client_itl_ms / 1e3)
            if probe.batch == 1 and probe.prompt >= blocker:
                lead_s = m.deltas["prefill_s"] * blocker / probe.prompt / 4
            ms.append(m)
            replays.append(rp)
            say(f"  probe {probe.name:<24} prefill {1e3 * m.deltas['prefill_s']:9.2f} ms  "
                f"decode {1e3 * m.deltas['decode_s']:9.2f} ms{'  (late: not fitted)' if m.late else ''}")
    return ms, replays


def _calibration_doc(variant, config, target: str, client: ProbeClient, theta: dict,
                     rows: list[dict], n_fitted: int, probe_s: float) -> dict:
    """The calibration file's content: the coefficients, how well they fit, what was measured."""
    errs = [abs(r["error"]) for r in rows if not r["late"]] or [abs(r["error"]) for r in rows]
    late = sorted({r["probe"] for r in rows if r["late"]})
    return {
        "format": CALIBRATION_FORMAT, "variant": variant.name, "hardware": config.hardware.name,
        "model": config.model.hf_id, "applies_to": applies_to(config), "source": "probes",
        "params": {k: float(f"{v:.6g}") for k, v in theta.items()},
        "fitted": list(FITTED),
        # what each coefficient prices (specs.cost_calibration.MECHANISMS)
        "mechanisms": {k: MECHANISMS[k] for k in theta},
        "fit": {"probes": n_fitted, "totals": len(errs), "rms_error": round(math.sqrt(
            sum(e * e for e in errs) / len(errs)), 4), "max_abs_error": round(max(errs), 4),
            "late_not_fitted": late},
        "measured": {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"), "target": target, "client_host": socket.gethostname(),
            "served_model": client.model, "server_version": client.version(),
            "server_version_note": client.version_note,
            "server_flags": list(variant.serve_args), "probe_seconds": round(probe_s, 2)},
        "residuals": rows,
    }
