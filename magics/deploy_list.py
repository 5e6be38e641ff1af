"""What ``%deploy --list`` shows: an HTML table in JupyterLab, plain text elsewhere.

Both come from the same rows. The HTML fits the cell's width (the endpoint's path
goes under its name, not in a column of its own); the text is for terminals,
nbconvert and papermill, where a saved notebook keeps it.
"""

from __future__ import annotations

from html import escape

from gpulab.client.units import gpu_label, plural

from .rich import ERROR, MUTED

EMPTY = "no deployments (start one with %deploy MODEL --name NAME --example X)"
#: The state's colour in the HTML table (the text says the state too).
_STATE_COLOURS = {
    "running": "#1a7f37",
    "starting": "#9a6700",
    "idle": MUTED,
    "degraded": "#bc4c00",
    "failed": ERROR,
}
_CELL = "border:1px solid #ddd;padding:2px 6px;text-align:{}"
#: Hex digits of a hash shown (as git shows commits).
SHORT = 12


def _num(value, fmt: str) -> str:
    return format(value, fmt) if value is not None else "-"


def version_line(v: dict, state: str) -> str:
    return (
        f"v{v['version']} · {v['weight']}% of calls · {state} · "
        f"{v['replicas_ready']}/{v['replicas']} ready · {plural(v['requests_total'], 'call')}, "
        f"{plural(v['errors_total'], 'error')} · p99 {_num(v['p99_latency_ms'], '.1f')} ms"
    )


def lineage_line(v: dict) -> str:
    """Where a version's model came from, in one line:
    ``v2 · job 3f2a9c1e0b7d · code 1a2b3c4d5e6f · data train-*@9f8e7d6c5b4a · int8-dynamic``."""
    lineage = v.get("lineage") or {}
    job = lineage.get("job")
    parts = [f"v{v['version']}"]
    if job is None:
        parts.append("not from a gpulab job")
    else:
        parts += [f"job {job['id']}", f"code {(job.get('code_hash') or '?')[:SHORT]}"]
        data = [f"{d['name']}@{d['version'][:SHORT]}" for d in job.get("datasets") or []]
        parts.append(f"data {', '.join(data)}" if data else "no cached data read")
    quant = lineage.get("quantization")
    parts.append(quant["scheme"] if quant else "not quantized")
    who = lineage.get("created_by")
    if who:
        parts.append(f"by {who} {(lineage.get('created') or v.get('created') or '')[:16]}")
    return " · ".join(parts)


def list_table(deps: list[dict], lineage: bool = False) -> str:
    """A fixed-width table for terminals and saved notebooks (``lineage``: a line per
    version saying where its model came from)."""
    if not deps:
        return EMPTY
    head = (
        f"{'name':<20} {'user':<12} {'state':<9} {'ready':>8} {'range':>6} "
        f"{'GPU per replica':>15} {'req/s':>7} {'p99 ms':>7}  path"
    )
    lines = [head, "-" * len(head)]
    for d in deps:
        low, high = d.get("min_replicas", d["replicas"]), d.get("max_replicas", d["replicas"])
        lines.append(
            f"{d['name']:<20} {d['user']:<12} {d['state']:<9} "
            f"{d['replicas_ready']:>3}/{d['replicas']:<4} {f'{low}:{high}':>6} "
            f"{gpu_label(d['gpu_milli']):>15} {_num(d.get('requests_per_second'), '.1f'):>7} "
            f"{_num(d.get('p99_latency_ms'), '.1f'):>7}  {d['path']}"
        )
        versions = d.get("versions") or []
        for v in versions if len(versions) > 1 else []:
            lines.append(f"    {version_line(v, v['state'])}")
        lines += [f"    {note}" for note in notes_of(d)]
        lines += [f"    {lineage_line(v)}" for v in versions if lineage]
    return "\n".join(lines)


#: The model kind of a language model (gpulab.serving.llm_export's card).
LANGUAGE_MODEL = "causal-lm"


def llm_line(d: dict) -> str:
    """A language model's line: tokens/s, the engine that serves it and why, and the
    model id to send the OpenAI gateway (``<hub>/services/gpulab/v1``)."""
    engine = d.get("engine") or "said once a replica is ready"
    return (
        f"language model · {_num(d.get('tokens_per_second'), '.1f')} tokens/s · "
        f"engine: {engine} · model id {d['name']} (others: {d['user']}/{d['name']}) "
        f"at /services/gpulab/v1"
    )


def notes_of(d: dict) -> list[str]:
    """The lines worth a user's attention under an endpoint: a version that failed,
    waits or frees its slices, and cold starts."""
    versions = d.get("versions") or []
    notes = [llm_line(d)] if d.get("model_kind") == LANGUAGE_MODEL else []
    for v in versions:
        shown = v["state"] in ("failed", "degraded", "idle") or "wants" in v["message"]
        if shown or v["message"].startswith("freeing"):
            notes.append(f"v{v['version']}: {v['message']}")
        if v.get("last_cold_start_s") is not None:
            notes.append(
                f"v{v['version']}: {plural(v['cold_starts'], 'cold start')}, the last "
                f"took {v['last_cold_start_s']:.1f} s"
            )
    if not versions and d["state"] in ("failed", "degraded"):
        notes.append(d["message"])
    return notes


def _td(html: str, align: str = "left") -> str:
    return f'<td style="{_CELL.format(align)}">{html}</td>'


def _wide(html: str, span: int, style: str = "") -> str:
    """A row of one cell across the table, indented under its endpoint."""
    css = f"{_CELL.format('left')};padding-left:18px;{style}"
    return f'<tr><td colspan="{span}" style="{css}">{html}</td></tr>'


def _state(state: str) -> str:
    colour = _STATE_COLOURS.get(state, MUTED)
    return f'<span style="color:{colour};font-weight:600">{escape(state)}</span>'


def list_html(deps: list[dict], lineage: bool = False) -> str:
    """The endpoints as one table; owners shown only when there are several (admins)."""
    if not deps:
        return f"<p>{escape(EMPTY)}</p>"
    owners = len({d["user"] for d in deps}) > 1
    headers = ["endpoint", *(["user"] if owners else []), "state", "ready", "replicas"]
    headers += ["GPU per replica", "req/s", "p99 ms"]
    right = {"ready", "replicas", "req/s", "p99 ms"}
    rows = []
    for d in deps:
        low, high = d.get("min_replicas", d["replicas"]), d.get("max_replicas", d["replicas"])
        name = (
            f"<b>{escape(d['name'])}</b><br>"
            f'<code style="font-size:11px;color:{MUTED}">{escape(d["path"])}</code>'
        )
        cells = [_td(name)]
        if owners:
            cells.append(_td(escape(d["user"])))
        cells += [
            _td(_state(d["state"])),
            _td(f"{d['replicas_ready']}/{d['replicas']}", "right"),
            _td(f"{low}" if low == high else f"{low}:{high}", "right"),
            _td(escape(gpu_label(d["gpu_milli"]))),
            _td(_num(d.get("requests_per_second"), ".1f"), "right"),
            _td(_num(d.get("p99_latency_ms"), ".1f"), "right"),
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
        versions = d.get("versions") or []
        span = len(headers)
        for v in versions if len(versions) > 1 else []:
            rows.append(_wide(version_line(v, _state(v["state"])), span))
        rows += [_wide(escape(note), span, f"color:{MUTED}") for note in notes_of(d)]
        if lineage:
            rows += [_wide(f"<code>{escape(lineage_line(v))}</code>", span) for v in versions]
    head = "".join(
        f'<th style="{_CELL.format("right" if h in right else "left")}">{escape(h)}</th>'
        for h in headers
    )
    return (
        '<table class="gpulab-deploy-list" style="border-collapse:collapse;font-size:12px">'
        f"<tr>{head}</tr>{''.join(rows)}</table>"
    )


def list_bundle(deps: list[dict], lineage: bool = False) -> dict[str, str]:
    """The display's forms: HTML for the lab, the text table for everything else."""
    return {"text/plain": list_table(deps, lineage), "text/html": list_html(deps, lineage)}
