"""The report page's pieces: its CSS and check script, and the HTML for tables and figures.

Wide tables show the columns an engineer reads first; the rest carry class "opt" and appear when
the checkbox before the table is ticked (CSS only, no script), so a table fits 1,400 px.
"""
from __future__ import annotations

import base64
import html
import itertools
from pathlib import Path

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1360px;color:#1d2330;padding:0 16px}
h1{font-size:1.6em;margin-bottom:0}h2{border-bottom:1px solid #d6dae3;padding-bottom:4px;margin-top:32px}
.sub{color:#5b6477;margin-top:2px}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}
th,td{border:1px solid #d6dae3;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f1f3f7}td.l,th.l{text-align:left}
tr.all td{font-weight:600;background:#fafbfd}
.flag{display:inline-block;background:#b3261e;color:#fff;border-radius:3px;padding:1px 6px;margin:1px;font-size:12px}
.warn{border-left:5px solid #b3261e;background:#fdecea;padding:8px 12px;margin:8px 0}
.verdict{border-left:5px solid #2d6cdf;background:#eef3fd;padding:8px 12px;margin:8px 0}
.noise{color:#8a6d00}
.scroll{overflow-x:auto;max-width:100%}
.opt{display:none}input.more:checked~.scroll .opt{display:table-cell}
.more+label{font-size:13px;color:#2d6cdf;cursor:pointer}
.headline{border-left:6px solid #1b7f3b;background:#eaf6ee;padding:10px 14px;margin:12px 0;font-size:1.1em}
.thin{border-left:5px solid #8a6d00;background:#fff8e1;padding:6px 12px;margin:4px 0;font-size:13px}
figure{margin:16px 0}figure img{max-width:100%;border:1px solid #e3e6ee}
figcaption{color:#5b6477;font-size:13px}
dl dt{font-weight:600;margin-top:8px}dl dd{margin-left:16px}
code{background:#f1f3f7;padding:0 3px}
"""

# Runs first: resource errors (a broken image) and script errors are recorded into the DOM, and
# once the page has loaded, body[data-images] says how many images decoded ("loaded/total").
PAGE_SCRIPT = """
(function () {
  var scriptErrors = [], resourceErrors = [];
  window.addEventListener('error', function (e) {
    if (e.target && e.target !== window && e.target.tagName) {
      resourceErrors.push(e.target.tagName + ' ' + (e.target.getAttribute('alt') || ''));
    } else {
      scriptErrors.push(String(e.message || e));
    }
  }, true);
  window.addEventListener('load', function () {
    var imgs = Array.prototype.slice.call(document.images);
    var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
    document.body.setAttribute('data-images', ok + '/' + imgs.length);
    document.body.setAttribute('data-script-errors', String(scriptErrors.length));
    document.body.setAttribute('data-resource-errors', String(resourceErrors.length));
    document.body.setAttribute('data-error-text', scriptErrors.concat(resourceErrors).join(' | '));
    document.body.setAttribute('data-ready', 'yes');
  });
})();
"""

DEFINITIONS = [
    ("TTFT", "from the request being sent to the first streamed chunk carrying output text."),
    ("ITL (shown everywhere as ITL)", "the per-token view, <code>itl_tokens</code>: each gap between "
     "consecutive content chunks divided by the tokens in the later chunk, counted once per token. "
     "It measures the pace at which text arrives, so speculative decoding (several tokens per chunk) "
     "is compared on the same scale as plain decoding. The chunk view (<code>itl_chunks</code>, one "
     "sample per gap, what <code>vllm bench serve</code> pools) is drawn dashed in the ITL CDFs where "
     "chunks carry more than one token."),
    ("TPOT", "(E2E - TTFT) / (output tokens - 1), for requests with more than one output token."),
    ("E2E", "from sending to the last chunk carrying output."),
    ("Measured window", "a stage's [measure_start, measure_end): requests count when sent inside it "
     "and not flagged warm-up; throughput counts output tokens of chunks that arrived inside it, "
     "divided by its length, so warm-up and cool-down output are left out."),
    ("Goodput", "completed requests per second (measured window) that met every SLO of their class; "
     "SLO attainment is their share of all counted requests, failures included."),
    ("p99 adj", "error-adjusted percentile: a failed request counts as infinitely slow, so it is "
     "infinite once more than about 1% of requests fail."),
    ("Confidence intervals", "95% bootstrap intervals over the raw requests (runs resampled too where "
     "a configuration was repeated); a difference whose ratio interval contains 1 is marked as within noise."),
]


_ids = itertools.count(1)


def esc(value) -> str:
    return html.escape("" if value is None else str(value))


def img(path: Path, alt: str, caption: str, facts: dict | None = None) -> str:
    """A figure with its PNG embedded, its alt text, and what it shows as data-* attributes
    (facts read back from the drawn axes: plots.py)."""
    data = base64.b64encode(path.read_bytes()).decode()
    attrs = "".join(f' data-{esc(k)}="{esc(v)}"' for k, v in (facts or {}).items())
    return (f'<figure data-figure="{esc(path.stem)}"{attrs}><img alt="{esc(alt)}" src="data:image/png;base64,{data}">'
            f'<figcaption>{esc(caption)} (<a href="{esc(path.name)}">{esc(path.name)}</a>)</figcaption></figure>')


def flag_badges(flags) -> str:
    return "".join(f'<span class="flag">{esc(f)}</span>' for f in flags or [])


def table(head: list[str], rows: list[list], optional: set[int] = frozenset(), left: set[int] = frozenset(),
          row_class: list[str] | None = None, raw: set[int] = frozenset()) -> str:
    """A scrollable table of formatted cells; columns in `optional` hidden until toggled, `raw`
    cells already HTML."""
    def attrs(i):
        cls = " ".join(c for c in ("opt" if i in optional else "", "l" if i in left else "") if c)
        return f' class="{cls}"' if cls else ""

    out = []
    if optional:
        n = next(_ids)
        out.append(f'<input type="checkbox" class="more" id="more{n}"><label for="more{n}">'
                   f"show all {len(head)} columns ({len(optional)} more)</label>")
    out.append('<div class="scroll"><table><tr>' + "".join(f"<th{attrs(i)}>{h}</th>" for i, h in enumerate(head)) + "</tr>")
    for k, cells in enumerate(rows):
        cls = f' class="{row_class[k]}"' if row_class and row_class[k] else ""
        out.append(f"<tr{cls}>" + "".join(f"<td{attrs(i)}>{c if i in raw else esc(c)}</td>"
                                          for i, c in enumerate(cells)) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)
