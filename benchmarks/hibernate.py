"""Hibernate and wake one kernel's namespace: gpulab against dill.dump_session, same run.

Each notebook below is a list of cell sources. For each, in a fresh interpreter
whose ``__main__`` is a fresh module (as in a kernel), the cells run one after
another (timed: "re-run", what a user without hibernate waits for), then:

- gpulab: ``gpulab.magics.namespace_state.save_namespace`` of ``user_variables``
  (timed: hibernate); then, in another fresh interpreter, ``load_namespace`` into
  a fresh ``__main__`` (timed: wake; the import of the module itself is timed
  apart, the imports the variables need, numpy, torch..., are part of the wake);
- dill: ``dill.dump_session`` of the same ``__main__`` in the same process, then
  ``dill.load_session`` in another fresh interpreter. dill pickles the session as
  one object: when one value cannot be pickled, nothing is saved, and that
  notebook counts 0 variables back for dill, with dill's reason.

Variables back are counted by name; arrays, frames, tensors, models, figures and
plain Python values are also compared with what the cells made (fingerprints of
their bytes), shown as ``eq`` (equal / compared). The issue's goal: hibernate and
wake each <= 10 s for a session holding 1 GiB (the ``gib`` notebook).

Kishu (kishu 0.3.4, the per-cell checkpointing anchor) is not compared: it has no
save/load call to time; it runs as an IPython extension inside a kernel attached
to a running Jupyter server, needs ``kishu init`` on a notebook file, and
checkpoints after every cell (its cost lands on every cell, not on the idle
kernel), which this subprocess harness cannot reproduce fairly.

    python benchmarks/hibernate.py [--quick] [--only NAME[,NAME]]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings

NOTEBOOKS: dict[str, list[str]] = {
    "torch_train": [
        "import torch\nfrom torch import nn\ntorch.manual_seed(0)",
        "x = torch.randn(2048, 64)\ny = (x[:, :4].sum(1, keepdim=True) > 0).float()",
        "model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))\n"
        "opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)\n"
        "loss_fn = nn.BCEWithLogitsLoss()",
        "losses = []\nfor step in range(30):\n    opt.zero_grad()\n    loss = loss_fn(model(x), y)\n"
        "    loss.backward()\n    opt.step()\n    sched.step()\n    losses.append(loss.item())",
        "best_state = {k: v.clone() for k, v in model.state_dict().items()}\n"
        "acc = ((model(x) > 0).float() == y).float().mean().item()",
    ],
    "cnn_bf16": [
        "import torch\nfrom torch import nn\ntorch.manual_seed(1)",
        "images = torch.randn(256, 3, 32, 32)\nlabels = torch.randint(0, 10, (256,))",
        "net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),\n"
        "                    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),\n"
        "                    nn.Flatten(), nn.Linear(32, 10))\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)",
        "for step in range(5):\n    opt.zero_grad()\n"
        "    loss = nn.functional.cross_entropy(net(images), labels)\n"
        "    loss.backward()\n    opt.step()",
        "import copy\nhalf_net = copy.deepcopy(net).to(torch.bfloat16)\n"
        "emb_bf16 = torch.randn(1000, 128).to(torch.bfloat16)\n"
        "sd = net.state_dict()\nfirst_layer = net[0].weight[:4]",
    ],
    "numpy_arrays": [
        "import numpy as np\nrng = np.random.default_rng(0)",
        "a = rng.standard_normal((1000, 1000))\nb = a.T.copy()\nc = a @ b",
        "ints = rng.integers(0, 100, size=100_000)\n"
        "rec = np.zeros(1000, dtype=[('id', 'i4'), ('score', 'f8'), ('tag', 'U8')])\n"
        "rec['id'] = np.arange(1000)\nrec['tag'] = 'x'",
        "masked = np.ma.masked_less(a[:100], 0)\nhist, edges = np.histogram(ints, bins=20)\n"
        "stats = {'mean': float(a.mean()), 'std': float(a.std())}\nsame = a",
    ],
    "pandas_groupby": [
        "import numpy as np\nimport pandas as pd\nrng = np.random.default_rng(2)",
        "n = 200_000\ndf = pd.DataFrame({'city': rng.choice(['paris', 'lyon', 'nice', 'lille'], n),\n"
        "                   'day': pd.date_range('2024-01-01', periods=n, freq='min'),\n"
        "                   'sales': rng.gamma(2.0, 10.0, n), 'units': rng.integers(1, 9, n)})\n"
        "df['city'] = df['city'].astype('category')",
        "by_city = df.groupby('city', observed=True).agg(sales=('sales', 'sum'), units=('units', 'mean'))\n"
        "daily = df.set_index('day').resample('D')['sales'].sum()\n"
        "pivot = df.assign(h=df.day.dt.hour).pivot_table(index='h', columns='city', values='sales', observed=True)",
        "grouped = df.groupby('city', observed=True)\ntop = df.nlargest(100, 'sales')\n"
        "labels = df['city'].astype(str).str.upper().head(1000)",
    ],
    "sklearn_fit": [
        "import numpy as np\nfrom sklearn.datasets import make_classification\n"
        "from sklearn.model_selection import train_test_split\n"
        "from sklearn.pipeline import make_pipeline\nfrom sklearn.preprocessing import StandardScaler\n"
        "from sklearn.linear_model import LogisticRegression\n"
        "from sklearn.ensemble import RandomForestClassifier",
        "X, y = make_classification(n_samples=5000, n_features=30, random_state=0)\n"
        "X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)",
        "logreg = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(X_train, y_train)\n"
        "forest = RandomForestClassifier(n_estimators=60, random_state=0).fit(X_train, y_train)",
        "scores = {'logreg': logreg.score(X_test, y_test), 'forest': forest.score(X_test, y_test)}\n"
        "proba = forest.predict_proba(X_test)",
    ],
    "plotly_figures": [
        "import numpy as np\nimport plotly.graph_objects as go\nimport plotly.express as px",
        "t = np.linspace(0, 10, 2000)\n"
        "fig = go.Figure([go.Scatter(x=t, y=np.sin(t), name='sin'), go.Scatter(x=t, y=np.cos(t), name='cos')])\n"
        "fig.update_layout(title='waves', template='plotly_white')",
        "iris = px.data.iris()\nscatter = px.scatter(iris, x='sepal_width', y='sepal_length', color='species')\n"
        "heat = go.Figure(go.Heatmap(z=np.random.default_rng(3).random((50, 50))))",
    ],
    "text_corpus": [
        "import collections, importlib, inspect, re\n"
        "names = ['collections', 'functools', 'itertools', 'json', 're', 'os', 'pathlib', 'typing',\n"
        "         'argparse', 'logging', 'subprocess', 'threading', 'asyncio', 'unittest', 'datetime',\n"
        "         'decimal', 'fractions', 'statistics', 'textwrap', 'string', 'inspect', 'ast', 'pickle',\n"
        "         'shutil', 'tempfile', 'csv', 'sqlite3', 'urllib.parse', 'zipfile', 'tarfile', 'difflib',\n"
        "         'heapq', 'random', 'enum', 'dataclasses', 'contextlib', 'io', 'email', 'http.client',\n"
        "         'xml.etree.ElementTree', 'socket', 'ssl', 'struct', 'copy', 'pprint', 'types',\n"
        "         'weakref', 'traceback', 'warnings', 'doctest', 'pdb', 'tokenize', 'configparser',\n"
        "         'hashlib', 'base64', 'html.parser', 'uuid', 'ipaddress', 'calendar', 'locale', 'queue']",
        "docs = {}\nfor name in names:\n    mod = importlib.import_module(name)\n"
        "    docs[name] = (mod.__doc__ or '') + '\\n'.join(\n"
        "        inspect.getdoc(obj) or '' for _, obj in inspect.getmembers(mod)\n"
        "        if inspect.isfunction(obj) or inspect.isclass(obj))\n"
        "corpus = '\\n'.join(docs.values())",
        'WORD = re.compile(r"[A-Za-z_][A-Za-z_\']+")\n'
        "words = [w.lower() for w in WORD.findall(corpus)]\ncounts = collections.Counter(words)\n"
        "bigrams = collections.Counter(zip(words, words[1:]))\ntop = counts.most_common(50)",
        "by_module = collections.defaultdict(list)\nfor name, text in docs.items():\n"
        "    by_module[len(text) // 10_000].append(name)\n"
        "sentences = re.split(r'(?<=[.!?])\\s+', corpus)\nlongest = max(sentences, key=len)",
    ],
    "defined_here": [
        "import dataclasses, enum, functools, math",
        "square = lambda v: v * v\nscale = 2.5\n"
        "def scaled(v):\n    return v * scale\n"
        "def make_acc(start):\n    total = [start]\n    def add(v):\n        total[0] += v\n        return total[0]\n"
        "    return add\nacc = make_acc(10)\nacc(5)",
        "@dataclasses.dataclass\nclass Run:\n    name: str\n    lr: float\n    epochs: int = 3\n"
        "    def cost(self):\n        return self.epochs * math.ceil(1 / self.lr)\n"
        "class Color(enum.Enum):\n    RED = 1\n    BLUE = 2\n"
        "class Shape:\n    sides = 0\n    def area(self):\n        raise NotImplementedError\n"
        "class Square(Shape):\n    sides = 4\n    def __init__(self, s):\n        self.s = s\n"
        "    def area(self):\n        return square(self.s)",
        "runs = [Run('a', 0.1), Run('b', 0.01, 5)]\nshapes = {c: Square(i) for i, c in enumerate(Color)}\n"
        "half = functools.partial(scaled)\ncached = functools.lru_cache(maxsize=None)(scaled)\n"
        "@functools.lru_cache(maxsize=None)\ndef fib(k):\n    return k if k < 2 else fib(k - 1) + fib(k - 2)\n"
        "fib(60)\n"
        "table = {r.name: r.cost() for r in runs}\nfavourite = Color.BLUE",
    ],
    "unsavable": [
        "import os, socket, threading\nimport numpy as np",
        "data = np.arange(100_000)\nconfig = {'path': os.__file__, 'size': 3}\nrows = [[i, i * i] for i in range(1000)]",
        "pending = (row for row in rows if row[0] % 2)\nhandle = open(os.__file__)\n"
        "lock = threading.Lock()\nsock = socket.socket()",
        "summary = {'rows': len(rows), 'first': next(pending)}",
    ],
    "mixed_std": [
        "import collections, datetime, decimal, fractions, pathlib, uuid\nimport numpy as np\n"
        "import scipy.sparse as sp",
        "when = datetime.datetime(2025, 5, 4, 12, 30)\nspan = datetime.timedelta(days=3)\n"
        "money = decimal.Decimal('12.30')\nratio = fractions.Fraction(3, 7)\nhome = pathlib.Path('/tmp/x')\n"
        "ident = uuid.UUID(int=7)",
        "queue = collections.deque(range(1000), maxlen=2000)\n"
        "graph = collections.defaultdict(set)\nfor i in range(2000):\n    graph[i % 97].add(i)\n"
        "ordered = collections.OrderedDict((str(i), i) for i in range(500))\n"
        "Point = collections.namedtuple('Point', 'x y')\npts = [Point(i, -i) for i in range(100)]",
        "rng = np.random.default_rng(5)\n"
        "adjacency = sp.random(2000, 2000, density=0.01, format='csr', random_state=5)\n"
        "degrees = np.asarray(adjacency.sum(axis=1)).ravel()",
    ],
    "gib": [
        "import numpy as np\nimport torch\nrng = np.random.default_rng(0)",
        "features = rng.standard_normal((8192, 8192))  # 512 MiB float64",
        "embeddings = rng.standard_normal((16384, 4096), dtype=np.float32)  # 256 MiB",
        "torch.manual_seed(0)\nweights = torch.randn(8192, 8192)  # 256 MiB float32",
        "labels = rng.integers(0, 10, size=8192)\nnorms = np.linalg.norm(features[:256], axis=1)",
    ],
}
BIG = {"gib"}
#: A next cell run after the wake: the variables that came back are usable, not just there.
NEXT_CELL = {
    "torch_train": "opt.zero_grad()\nloss_fn(model(x), y).backward()\nopt.step()\n"
    "assert opt.param_groups[0]['params'][0] is model[0].weight",
    "cnn_bf16": "assert sd['0.weight'].data_ptr() == net[0].weight.data_ptr()\n"
    "assert emb_bf16.dtype is torch.bfloat16\nnet(images[:2])",
    "pandas_groupby": "assert grouped.sales.sum().equals(by_city.sales)",
    "sklearn_fit": "assert forest.score(X_test, y_test) == scores['forest']",
    "text_corpus": "assert counts.most_common(50) == top and WORD.match('abc')",
    "defined_here": "assert fib(60) == 1548008755920 and acc(1) == 16 and scaled(2) == 5.0\n"
    "assert shapes[Color.BLUE].area() == 1 and runs[1].cost() == 500 and isinstance(runs[0], Run)\n"
    "scale = 1\nassert scaled(2) == 2 and half(3) == 3 and cached(4) == 4",
    "mixed_std": "assert adjacency.shape == (2000, 2000) and pts[3].x == 3 and money + 1 == decimal.Decimal('13.30')",
}


# ---------------------------------------------------------------------------------------
# Inside the child interpreters
# ---------------------------------------------------------------------------------------


def fresh_main() -> types.ModuleType:
    """A new ``__main__`` for the cells, as IPython makes one for a kernel."""
    mod = types.ModuleType("__main__")
    mod.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = mod
    return mod


def fingerprint(v):
    """A digest of a value's content for the types a hibernate must give back equal,
    or None where there is no cheap, faithful one."""
    h = hashlib.blake2b(digest_size=16)
    mod = type(v).__module__.split(".")[0]
    try:
        if mod == "numpy" and type(v).__name__ == "ndarray" and v.dtype != object:
            import numpy as np

            h.update(f"{v.dtype.str}{v.shape}".encode())
            h.update(np.ascontiguousarray(v).reshape(-1).view(np.uint8).data)
        elif mod == "pandas" and hasattr(v, "to_numpy") and hasattr(v, "index"):
            import pandas as pd

            h.update(
                repr((list(getattr(v, "columns", [])), str(getattr(v, "dtypes", "")))).encode()
            )
            h.update(pd.util.hash_pandas_object(v, index=True).to_numpy().tobytes())
        elif mod == "torch" and hasattr(v, "untyped_storage"):
            import torch

            t = v.detach().cpu().contiguous().reshape(-1)
            h.update(f"{t.dtype}{tuple(v.shape)}{type(v).__name__}".encode())
            h.update(t.view(torch.uint8).numpy().data)
        elif hasattr(v, "state_dict") and hasattr(v, "parameters"):
            for k, t in v.state_dict().items():
                h.update(k.encode() + (fingerprint(t) or "").encode())
        elif mod == "plotly":
            h.update(json.dumps(v.to_plotly_json(), sort_keys=True, default=str).encode())
        elif isinstance(v, int | float | str | bytes | tuple | list | dict | set):
            text = repr(v)
            if len(text) > 50_000_000 or " at 0x" in text:
                return None
            h.update(text.encode())
        else:
            return None
    except Exception:
        return None
    return h.hexdigest()


def child_save(name: str, work: str) -> dict:
    mod = fresh_main()
    t0 = time.perf_counter()
    for i, src in enumerate(NOTEBOOKS[name]):
        exec(compile(src, f"<{name} cell {i + 1}>", "exec"), mod.__dict__)
    rerun = time.perf_counter() - t0

    from gpulab.magics.namespace_state import save_namespace, user_variables

    variables = user_variables(types.SimpleNamespace(user_ns=mod.__dict__))
    prints = {k: fingerprint(v) for k, v in variables.items()}
    out = {"rerun_s": rerun, "names": list(variables), "prints": prints}

    path = os.path.join(work, f"{name}.ns")
    report = save_namespace(variables, path)
    out["gpulab"] = {"hibernate_s": report.seconds, "bytes": os.path.getsize(path)}

    import dill

    dpath = os.path.join(work, f"{name}.dill")
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dill.dump_session(dpath)
        out["dill"] = {"dump_s": time.perf_counter() - t0, "bytes": os.path.getsize(dpath)}
    except Exception as exc:
        with_reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        out["dill"] = {"dump_s": time.perf_counter() - t0, "error": with_reason[:90]}
        if os.path.exists(dpath):
            os.unlink(dpath)
    return out


def compare(mod: types.ModuleType, names: list[str], prints: dict) -> dict:
    back = [n for n in names if n in mod.__dict__]
    checked = [n for n in back if prints.get(n)]
    equal = [n for n in checked if fingerprint(mod.__dict__[n]) == prints[n]]
    return {"back": len(back), "checked": len(checked), "equal": len(equal)}


def child_load(kind: str, name: str, work: str) -> dict:
    with open(os.path.join(work, f"{name}.save.json")) as f:
        saved = json.load(f)
    mod = fresh_main()
    out = {}
    if kind == "gpulab":
        t0 = time.perf_counter()
        from gpulab.magics.namespace_state import load_namespace

        out["import_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = load_namespace(os.path.join(work, f"{name}.ns"), mod.__dict__)
        out["seconds"] = time.perf_counter() - t0
        out["failed"] = report.failed
    else:
        import dill

        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dill.load_session(os.path.join(work, f"{name}.dill"))
        out["seconds"] = time.perf_counter() - t0
    out.update(compare(mod, saved["names"], saved["prints"]))
    if name in NEXT_CELL:
        try:
            exec(compile(NEXT_CELL[name], f"<{name} next cell>", "exec"), mod.__dict__)
            out["next_cell"] = "ok"
        except Exception as exc:
            out["next_cell"] = f"{type(exc).__name__}: {exc}"[:120]
    return out


# ---------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------


def run_child(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode:
        raise RuntimeError(f"child {args} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def measure(name: str, work: str) -> dict:
    run_child("save", name, work)
    with open(os.path.join(work, f"{name}.save.json")) as f:
        r = json.load(f)
    run_child("gpulab", name, work)
    with open(os.path.join(work, f"{name}.gpulab.json")) as f:
        r["gpulab"].update(json.load(f))
    os.unlink(os.path.join(work, f"{name}.ns"))
    if "error" not in r["dill"]:
        try:
            run_child("dill", name, work)
            with open(os.path.join(work, f"{name}.dill.json")) as f:
                r["dill"].update(json.load(f))
        except RuntimeError as exc:
            last = [ln for ln in str(exc).splitlines() if ln.strip()][-1]
            r["dill"]["error"] = "load: " + last[:80]
        os.unlink(os.path.join(work, f"{name}.dill"))
    return r


def row(name: str, r: dict) -> str:
    g, d, total = r["gpulab"], r["dill"], len(r["names"])
    ok = "error" not in d
    g_back, g_eq = f"{g['back']}/{total}", f"{g['equal']}/{g['checked']}"
    d_back = f"{d['back']}/{total}" if ok else f"0/{total}"
    d_eq = f"{d['equal']}/{d['checked']}" if ok else "-"
    d_load = f"{d['seconds']:6.2f}" if ok else "-"
    d_mb = f"{d['bytes'] / 1e6:7.1f}" if ok else "-"
    return (
        f"{name:15} {total:4} {g_back:>11} {g_eq:>5} {g['hibernate_s']:6.2f} {g['seconds']:6.2f} "
        f"{g['bytes'] / 1e6:7.1f} {d_back:>9} {d_eq:>5} {d['dump_s']:6.2f} {d_load:>6} {d_mb:>7} "
        f"{r['rerun_s']:8.2f}  {'' if ok else d['error']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip the 1 GiB notebook")
    parser.add_argument("--only", help="comma-separated notebook names: " + ", ".join(NOTEBOOKS))
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        kind, name, work = args.child
        result = child_save(name, work) if kind == "save" else child_load(kind, name, work)
        with open(os.path.join(work, f"{name}.{kind}.json"), "w") as f:
            json.dump(result, f)
        return 0

    names = list(NOTEBOOKS)
    if args.only:
        names = [n.strip() for n in args.only.split(",")]
        unknown = set(names) - set(NOTEBOOKS)
        if unknown:
            parser.error(f"unknown notebook(s) {sorted(unknown)}; known: {', '.join(NOTEBOOKS)}")
    if args.quick:
        names = [n for n in names if n not in BIG]

    print(
        f"{len(names)} notebooks, each: cells run in a fresh interpreter, saved by gpulab and by "
        f"dill.dump_session, each loaded in another fresh interpreter ({os.cpu_count()} CPUs)"
    )
    header = (
        f"{'notebook':15} {'vars':>4} {'gpulab back':>11} {'eq':>5} {'hib s':>6} {'wake s':>6} "
        f"{'MB':>7} {'dill back':>9} {'eq':>5} {'dump s':>6} {'load s':>6} {'dill MB':>7} "
        f"{'re-run s':>8}  dill failed on"
    )
    print(header)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpulab-hibernate-") as work:
        for name in names:
            r = measure(name, work)
            rows.append((name, r))
            print(row(name, r), flush=True)

    rows_by = dict(rows)
    total = sum(len(r["names"]) for _, r in rows)
    g_back = sum(r["gpulab"]["back"] for _, r in rows)
    d_back = sum(r["dill"].get("back", 0) for _, r in rows if "error" not in r["dill"])
    wake = sum(r["gpulab"]["seconds"] for _, r in rows)
    rerun = sum(r["rerun_s"] for _, r in rows)
    ratios = [r["gpulab"]["seconds"] / r["rerun_s"] for _, r in rows]
    print()
    print(
        f"variables back: gpulab {g_back}/{total} ({g_back / total:.0%}), "
        f"dill {d_back}/{total} ({d_back / total:.0%}); "
        f"dill saved nothing for {sum('error' in r['dill'] for _, r in rows)} of {len(rows)} notebooks"
    )
    print(
        f"wake vs re-run every cell: gpulab wake {wake:.2f} s in all, re-run {rerun:.2f} s: "
        f"{wake / rerun:.2f}x (median per notebook {statistics.median(ratios):.2f}x)"
    )
    both = [
        (r["gpulab"]["seconds"], r["dill"]["seconds"]) for _, r in rows if "error" not in r["dill"]
    ]
    if both:
        print(
            f"where dill loads: gpulab wake {sum(g for g, _ in both):.2f} s, dill load "
            f"{sum(d for _, d in both):.2f} s ({sum(d for _, d in both) / sum(g for g, _ in both):.2f}x); "
            f"hibernate: gpulab {sum(r['gpulab']['hibernate_s'] for _, r in rows):.2f} s, dill dump "
            f"{sum(r['dill']['dump_s'] for _, r in rows):.2f} s"
        )
    checked = [n for n, r in rows if n in NEXT_CELL]
    good = [n for n in checked if rows_by[n]["gpulab"].get("next_cell") == "ok"]
    dgood = [n for n in checked if rows_by[n]["dill"].get("next_cell") == "ok"]
    print(
        f"a next cell using the variables runs after the wake: gpulab {len(good)}/{len(checked)}, "
        f"dill {len(dgood)}/{len(checked)} notebooks"
    )
    imports = [r["gpulab"]["import_s"] for _, r in rows]
    print(
        f"import gpulab.magics.namespace_state (not in wake): median {statistics.median(imports):.2f} s"
    )
    for name, r in rows:
        if name in BIG:
            g = r["gpulab"]
            ok = r["gpulab"]["hibernate_s"] <= 10 and g["seconds"] <= 10
            print(
                f"goal, {g['bytes'] / 2**30:.2f} GiB session: hibernate {r['gpulab']['hibernate_s']:.2f} s, "
                f"wake {g['seconds']:.2f} s (<= 10 s each: {'met' if ok else 'NOT met'})"
            )
        if r["gpulab"].get("next_cell", "ok") != "ok":
            print(f"{name}: the next cell fails after the gpulab wake: {r['gpulab']['next_cell']}")
        if r["gpulab"]["failed"]:
            print(
                f"{name}: not back with gpulab: "
                + "; ".join(f"{n} ({w})" for n, w in r["gpulab"]["failed"])
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
