"""The answer (answer.py) in words: one block per path, each line naming whether its figures are
measured or predicted, and an opening verdict. The terminal and the report print the same lines
(``answer_blocks``), so the demo's last screen and the report's first section cannot differ.
Numbers are written by the metric catalogue."""
from __future__ import annotations

import textwrap

from .answer import THROUGHPUT, Answer, Crossover, Lead, PathAnswer, better_is
from .catalogue import FLAG_MEANING, METRICS, format_value, level_text, pct

SOURCE = {
    "predicted": "PREDICTED in virtual time (the simulator's engine and cost model; no server ran, "
                 "no request was sent)",
    "measured": "MEASURED: requests sent by Locust and timed by the client",
}
SERVERS = {"sim": "simulated vLLM server processes", "local": "vllm serve processes",
           "compose": "servers in containers", "external": "an external server"}
WIDTH = 100  # the demo's banners are 100 columns wide
SLO_NAMES = (("slo_ttft_ms", "TTFT"), ("slo_tpot_ms", "TPOT"), ("slo_itl_ms", "ITL"), ("slo_e2e_ms", "E2E"))


def _levels(levels: list[float], unit: str) -> str:
    if not levels:
        return "no load level with requests"
    if len(levels) == 1:
        return f"{level_text(levels[0])} {unit}"
    if len(levels) == 2:
        return f"{level_text(levels[0])} and {level_text(levels[1])} {unit}"
    return f"{level_text(levels[0])}-{level_text(levels[-1])} {unit}"


def _segments(leads: list[Lead]) -> list[tuple[str | None, list[Lead]]]:
    """Neighbouring loads with the same leader, in load order."""
    out: list[tuple[str | None, list[Lead]]] = []
    for lead in leads:
        if out and out[-1][0] == lead.winner:
            out[-1][1].append(lead)
        else:
            out.append((lead.winner, [lead]))
    return out


def _span(leads: list[Lead], unit: str) -> str:
    return _levels([x.level for x in leads], unit)


def leaders(path: PathAnswer, metric: str) -> str:
    """'gptq_int4 at 1-32 users, fp8 at 64-300 users', with the loads where a lead is within
    run-to-run noise or a tie named."""
    parts = []
    for winner, run in _segments(path.leads.get(metric, [])):
        noisy = [level_text(x.level) for x in run if x.clear is False]
        text = (f"{winner} at " if winner else "a tie at ") + _span(run, path.unit)
        parts.append(text + (f" (within noise at {', '.join(noisy)})" if noisy else ""))
    return ", ".join(parts)


NOT_COMPARED = "not compared: fewer than two variants with requests"


def _ranked(path: PathAnswer, metric: str) -> str:
    """'highest for gptq_int4 at 1-32 users, ...', or why nothing is ranked."""
    text = leaders(path, metric)
    return f"{better_is(metric)} for {text}" if text else NOT_COMPARED


def crossover_text(path: PathAnswer, c: Crossover) -> str:
    def at(lead: Lead) -> str:
        return (f"{level_text(lead.level)} {path.unit}: {c.was} {format_value(c.metric, lead.values.get(c.was))}, "
                f"{c.now} {format_value(c.metric, lead.values.get(c.now))}")

    return (f"{c.now} passes {c.was} between {level_text(c.before.level)} and {level_text(c.after.level)} "
            f"{path.unit} ({at(c.before)}; {at(c.after)} {_unit(c.metric)})")


def _unit(metric: str) -> str:
    return {"tokens/s": "tok/s"}.get(METRICS[metric].unit, METRICS[metric].unit)


def frontier_text(path: PathAnswer) -> list[str]:
    """One phrase per variant, best frontier first: the load it sustains and the first load that
    misses; variants that meet the target at every load tried share one phrase."""
    out, never = [], []
    for f in path.frontier:
        row = f.row
        miss = "" if row.first_failing is None else (
            f"misses at {level_text(row.first_failing)} ({pct(f.attainment_at_failing)} within SLO)")
        if row.max_level is None:
            out.append(f"{row.label} meets it at no load tried: {miss}")
        elif row.first_failing is None:
            never.append(row)
        else:
            out.append(f"{row.label} sustains {level_text(row.max_level)} {path.unit}, {miss}")
    if never:
        top = max(r.top_level for r in never)
        who = "every variant" if len(never) == len(path.frontier) > 1 else ", ".join(r.label for r in never)
        out.insert(0, f"{who} meets it at every load tried (up to {level_text(top)} {path.unit}): "
                   "no load tried misses")
    return out


def slo_text(path: PathAnswer, target: float) -> str:
    def one(row: dict) -> str:
        return ", ".join(f"{name} <= {row[col]:g} ms" for col, name in SLO_NAMES if row[col] is not None)

    rule = (one(path.slos[0]) if len(path.slos) == 1
            else "; ".join(f"{r['class_name']}: {one(r)}" for r in path.slos)) or "no SLO set"
    return f"{target:.0%} of requests within {rule}"


def heading(path: PathAnswer) -> list[str]:
    source = SOURCE[path.kind]
    if path.kind == "measured":
        source += f" ({SERVERS.get(path.backend, 'servers')})"
    traffic = ("" if path.prompt_tokens is None else
               f"; requests of ~{path.prompt_tokens:.0f} prompt and ~{path.output_tokens:.0f} output tokens")
    where = f" on {path.hardware}" if path.hardware else ""
    return [source, f"profile {path.profile}{where}, {_levels(path.levels, path.unit)}{traffic}"]


def path_lines(path: PathAnswer, target: float) -> list[tuple[str, str]]:
    """(what, text) rows of one path's block."""
    rows = [(METRICS[THROUGHPUT].label, _ranked(path, THROUGHPUT))]
    crossings = path.crossovers()
    rows.append(("crossover", "; ".join(crossover_text(path, c) for c in crossings)
                 if crossings else "none: the same variant leads at every load compared"))
    for metric in (m for m in path.leads if m != THROUGHPUT):
        rows.append((METRICS[metric].label, _ranked(path, metric)))
    rows.append(("SLO frontier", slo_text(path, target) + ":"))
    rows += [("", text) for text in frontier_text(path)]
    for flag in dict.fromkeys(f for fl in path.flags.values() for f in fl):
        who = ", ".join(label for label, fl in path.flags.items() if flag in fl)
        rows.append(("flagged", f"{who} {flag}: " + FLAG_MEANING.get(flag, "set by the recorder")))
    return rows


def verdict(answer: Answer) -> list[str]:
    """The opening lines: the widest path's throughput leaders and frontier, then whether each other
    path finds the same crossover. Every line says measured or predicted."""
    if not answer.paths:
        return ["no runs to answer from"]
    wide = max(answer.paths, key=lambda p: len(p.levels))
    head = f"{wide.kind.capitalize()} ({_where(wide)})"
    cross = "; ".join(f"{c.now} passes {c.was} between {level_text(c.before.level)} and "
                      f"{level_text(c.after.level)} {wide.unit}" for c in wide.crossovers())
    most = leaders(wide, THROUGHPUT)
    out = [f"{head}: " + (f"the most {METRICS[THROUGHPUT].label} from {most}" if most else NOT_COMPARED)
           + (f" (crossover: {cross})." if cross else ".")]
    out.append(f"{wide.kind.capitalize()} SLO frontier: " + _frontier_verdict(wide) + ".")
    for other in (p for p in answer.paths if p is not wide):
        out.append(_agreement(wide, other))
    return out


def _where(path: PathAnswer) -> str:
    """'quant_sweep, 1-300 users, ~512/256 tokens in/out': the crossover moves with the traffic."""
    tokens = ("" if path.prompt_tokens is None else
              f", ~{path.prompt_tokens:.0f}/{path.output_tokens:.0f} tokens in/out")
    return f"{path.profile}, {_levels(path.levels, path.unit)}{tokens}"


def _frontier_verdict(path: PathAnswer) -> str:
    if not path.frontier:
        return "no load levels with requests"
    best = path.frontier[0].row
    if best.max_level is None:
        return "no variant meets the target at any load tried"
    same = [f for f in path.frontier if f.row.max_level == best.max_level]
    if len(same) == len(path.frontier) > 1:
        who = "every variant sustains"
    else:
        who = ", ".join(f.row.label for f in same) + (" sustains" if len(same) == 1 else " sustain")
    text = f"{who} {level_text(best.max_level)} {path.unit}"
    failing = [f for f in same if f.row.first_failing is not None]
    if failing:
        text += f"; at {level_text(failing[0].row.first_failing)} {path.unit} " + ", ".join(
            f"{f.row.label} {pct(f.attainment_at_failing)}" for f in failing) + " of requests within SLO"
    else:
        text += ", the most load tried (no load tried misses)"
    rest = [f for f in path.frontier if f not in same]
    for f in rest:
        row = f.row
        text += (f"; {row.label} {level_text(row.max_level)} {path.unit}" if row.max_level is not None
                 else f"; {row.label} none") + (
            f" (misses at {level_text(row.first_failing)}: {pct(f.attainment_at_failing)})"
            if row.first_failing is not None else "")
    return text


def _agreement(wide: PathAnswer, other: PathAnswer) -> str:
    most = leaders(other, THROUGHPUT)
    head = f"{other.kind.capitalize()} ({_where(other)}): " + (
        f"the most {METRICS[THROUGHPUT].label} from {most}" if most else NOT_COMPARED)
    mine = other.crossovers()
    if not mine:
        return head + "; no crossover there."
    pairs = {(c.was, c.now) for c in wide.crossovers()}
    same = all((c.was, c.now) in pairs for c in mine)
    where = "; ".join(f"{c.now} passes {c.was} between {level_text(c.before.level)} and "
                      f"{level_text(c.after.level)} {other.unit}" for c in mine)
    return head + (f": the same crossover as {wide.kind} ({where})." if same
                   else f": {where}, a crossover the {wide.kind} path does not show.")


def answer_blocks(answer: Answer) -> tuple[list[str], list[tuple[str, list[str], list[tuple[str, str]]]]]:
    """(verdict lines, [(kind, heading lines, rows)] per path): everything the answer says."""
    return verdict(answer), [(p.kind, heading(p), path_lines(p, answer.target)) for p in answer.paths]


def render_text(answer: Answer) -> str:
    lines, blocks = answer_blocks(answer)
    out = [w for line in lines for w in textwrap.wrap(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False)]
    for _, head, rows in blocks:
        out += ["", *head]
        width = max(len(what) for what, _ in rows)
        for what, text in rows:
            out += textwrap.wrap(text, WIDTH, initial_indent=f"  {what:<{width}}  ",
                                 subsequent_indent=" " * (width + 4), break_on_hyphens=False)
    return "\n".join(out)


def render_html(answer: Answer, figure: str = "") -> str:
    """The report's opening section: the same lines as render_text, then the figure's HTML."""
    from .report_html import esc

    lines, blocks = answer_blocks(answer)
    out = ['<section id="answer">', "<h2>Answer</h2>",
           '<div class="headline">' + "<br>".join(esc(x) for x in lines) + "</div>"]
    for kind, head, rows in blocks:
        out.append(f'<h3 data-kind="{esc(kind)}">{esc(head[0])}</h3><p>{esc(head[1])}</p>')
        cells = "".join(f'<tr><th class="l">{esc(what)}</th><td class="l">{esc(text)}</td></tr>' for what, text in rows)
        out.append(f'<table class="answer">{cells}</table>')
    out.append(figure)
    out.append("<p>Computed from the stored rows (views <code>stage_summary</code> and "
               "<code>slo_frontier_at(target)</code>, winners as <code>servelab compare</code> judges them) "
               "of every run named above; the rest of the report covers the runs listed under Runs.</p></section>")
    return "\n".join(out)


__all__ = ["answer_blocks", "crossover_text", "frontier_text", "leaders", "render_html", "render_text", "verdict"]
