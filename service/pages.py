"""The gpulab page of the hub: GPUs and allocations, for people (admins see all)."""

from __future__ import annotations

from html import escape

from .auth import BaseHandler

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; }
table { border-collapse: collapse; margin-bottom: 2rem; }
th, td { border: 1px solid #ccc; padding: .3rem .7rem; text-align: left; }
th { background: #f3f3f3; }
.sim { color: #a60; }
"""


def _table(headers: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = (
        "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
        or f"<tr><td colspan={len(headers)}>none</td></tr>"
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class HomeHandler(BaseHandler):
    def get(self):
        if self.identity is None:
            if self._forbidden_model is None:
                return self.redirect(self.get_login_url())
            self.require_identity()
        who = self.identity
        inv = self.gpulab.inventory()
        gpu_rows = [
            [
                n["name"],
                g["index"],
                g["model"],
                g["uuid"],
                g["memory_mib"],
                f"{g['allocated_milli']} / 1000",
                "simulated" if g["simulated"] else "",
            ]
            for n in inv["nodes"]
            for g in n["gpus"]
        ]
        allocs = self.gpulab.ledger.list(user=None if who.admin else who.name)
        alloc_rows = [
            [
                a["user"],
                a["owner_kind"],
                a["owner"],
                a["node"],
                a["gpu_index"],
                a["milli"],
                a["memory_mib"],
                a["created"],
            ]
            for a in allocs
        ]
        scope = "every user's allocations (you are an admin)" if who.admin else "your allocations"
        note = f"<p>No GPUs: {escape(inv['reason'])}</p>" if inv.get("reason") else ""
        self.set_header("Content-Type", "text/html; charset=utf-8")
        hub_home = escape(self.hub_auth.hub_host + self.hub_auth.hub_prefix) + "home"
        gpu_table = _table(
            ["node", "GPU", "model", "UUID", "memory MiB", "allocated milli", ""], gpu_rows
        )
        self.finish(f"""<!doctype html><html><head><meta charset="utf-8">
<title>gpulab</title><style>{_STYLE}</style></head><body>
<h1>gpulab</h1><p>Signed in as <b>{escape(who.name)}</b>.
<a href="{hub_home}">Back to the hub</a></p>
<h2>GPUs</h2>{note}{gpu_table}
<h2>Allocations: {escape(scope)}</h2>
{_table(["user", "kind", "owner", "node", "GPU", "milli", "memory MiB", "since"], alloc_rows)}
<p>API: <code>{escape(self.gpulab.prefix)}api/v1/openapi.json</code></p>
</body></html>""")


routes = [(r"", HomeHandler)]
