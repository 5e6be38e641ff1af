"""What the kubelet does to a container before it runs it, for the tests that run pods' commands.

Only two things, both documented Kubernetes behaviour:

- the downward API: ``valueFrom.fieldRef`` of an annotation or ``status.podIP``
  becomes a plain value (the test says which pod it plays);
- ``$(VAR)`` in env values, ``command`` and ``args`` is replaced by the value
  of VAR if the container defines it (env values see only the variables before
  them), ``$$`` is a literal ``$``, and an undefined ``$(VAR)`` stays as written.
"""

from __future__ import annotations

import re

_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _REF.sub(sub, text)


def container_env(
    container: dict, *, annotations: dict, pod_ip: str, secrets: dict | None = None
) -> dict[str, str]:
    """``secrets``: ``{secret name: {key: value}}``, the Secrets the pod may name."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
            continue
        if "secretKeyRef" in e["valueFrom"]:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = (secrets or {})[ref["name"]][ref["key"]]
            continue
        path = e["valueFrom"]["fieldRef"]["fieldPath"]
        if path == "status.podIP":
            env[e["name"]] = pod_ip
        else:
            m = re.fullmatch(r"metadata\.annotations\['(.+)'\]", path)
            assert m, f"this stand-in knows annotations and status.podIP, not {path}"
            env[e["name"]] = annotations[m.group(1)]
    return env


def container_argv(container: dict, env: dict[str, str]) -> list[str]:
    return [expand(a, env) for a in container.get("command", []) + container.get("args", [])]
