"""Every Prometheus metric family a vLLM source tree defines: name, type, labels, defining file.

Run on an unzipped wheel: python3 extract.py /tmp/v033 > names.json. Names come from string
constants "vllm:<name>" outside vllm/benchmarks (the client reads, it defines nothing); the type
from the call that registers it (Gauge/Counter/Histogram/Info constructors, the connectors'
*CounterMetadata/*GaugeMetadata/*HistogramMetadata), resolving class/module constants."""
import ast, json, re, sys, pathlib
root = pathlib.Path(sys.argv[1])
NAME = re.compile(r"^vllm:[a-z][a-z0-9_]*$")
# vLLM publishes its *_info metrics (cache_config_info) as gauges of value 1, so "info" reads gauge.
TYPES = (("histogram", "histogram"), ("counter", "counter"), ("gauge", "gauge"), ("info", "gauge"),
         ("summary", "summary"))
def kind_of(func):
    n = (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")).lower()
    for k, v in TYPES:
        if k in n:
            return v
    return None
files = {}
for p in sorted(root.rglob("*.py")):
    rel = str(p.relative_to(root))
    if rel.startswith("vllm/benchmarks"):
        continue
    try:
        files[rel] = ast.parse(p.read_text())
    except SyntaxError:
        pass
consts = {}   # "Class.ATTR" / "NAME" -> metric name
names = {}
for rel, tree in files.items():
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant) \
                        and isinstance(st.value.value, str) and NAME.match(st.value.value):
                    for t in st.targets:
                        if isinstance(t, ast.Name):
                            consts[f"{node.name}.{t.id}"] = st.value.value
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str) and NAME.match(node.value.value):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    consts[t.id] = node.value.value
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.match(node.value):
            names.setdefault(node.value, {"type": None, "labels": None, "files": []})
            if rel not in names[node.value]["files"]:
                names[node.value]["files"].append(rel)
def resolve(expr):
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str) and NAME.match(expr.value):
        return expr.value
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return consts.get(f"{expr.value.id}.{expr.attr}")
    if isinstance(expr, ast.Name):
        return consts.get(expr.id)
    return None
for rel, tree in files.items():
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        k = kind_of(node.func)
        if k is None:
            continue
        cands = [kw.value for kw in node.keywords if kw.arg == "name"] + node.args[:1]
        for c in cands:
            n = resolve(c)
            if n and n in names:
                entry = names[n]
                entry["type"] = entry["type"] or k
                for kw in node.keywords:
                    if kw.arg == "labelnames" and entry["labels"] is None:
                        try:
                            entry["labels"] = list(ast.literal_eval(kw.value))
                        except Exception:
                            entry["labels"] = ast.unparse(kw.value)
                break
# `metrics[Names.X] = OffloadingCounterMetadata(...)` and `counter_specs = [("vllm:..", doc)]`
for rel, tree in files.items():
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        for t in node.targets:
            if isinstance(t, ast.Subscript) and isinstance(node.value, ast.Call):
                n, k = resolve(t.slice), kind_of(node.value.func)
                if n in names and k and names[n]["type"] is None:
                    names[n]["type"] = k
            if isinstance(t, ast.Name) and isinstance(node.value, (ast.List, ast.Tuple)):
                k = next((v for key, v in TYPES if key in t.id.lower()), None)
                for sub in ast.walk(node.value):
                    n = resolve(sub)
                    if n in names and k and names[n]["type"] is None:
                        names[n]["type"] = k
json.dump(dict(sorted(names.items())), sys.stdout, indent=1)
