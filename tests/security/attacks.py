"""What a user's code tries against another user and the hub, from inside a
kernel, a job rank or anything else that runs as the user.

Sent as source text and run with ``TARGETS`` set (a dict of lists); prints one
line, ``ATTACK-RESULT <json>``: each attempt's outcome. Only a permission
error counts as refused; a missing target is reported as such, so a wrong
path cannot pass for a refusal.
"""

import json
import os
import pwd


def attempt(action):
    try:
        action()
    except PermissionError:
        return "refused"
    except FileNotFoundError:
        return "missing"
    except ProcessLookupError:
        return "missing"
    except OSError as e:
        return f"error {e.errno}"
    return "ALLOWED"


def _read(path):
    with open(path, "rb") as f:
        f.read(1)


def _write(path):
    with open(path, "w") as f:
        f.write("written by another user")


def run(targets):
    results = {}
    for path in targets.get("read", []):
        results[f"read {path}"] = attempt(lambda p=path: _read(p))
    for path in targets.get("list", []):
        results[f"list {path}"] = attempt(lambda p=path: os.listdir(p))
    for path in targets.get("write", []):
        results[f"write {path}"] = attempt(lambda p=path: _write(p))
    for pid in targets.get("environ", []):
        results[f"read /proc/{pid}/environ"] = attempt(lambda p=pid: _read(f"/proc/{p}/environ"))
    for pid in targets.get("signal", []):
        # Signal 0 asks the kernel the same permission question as SIGKILL
        # without harming the target if the answer were yes.
        results[f"signal {pid}"] = attempt(lambda p=pid: os.kill(p, 0))
    own = {}
    for path in targets.get("own", []):
        own[path] = attempt(lambda p=path: _read(p))
    print(
        "ATTACK-RESULT "
        + json.dumps(
            {
                "uid": os.getuid(),
                "gid": os.getgid(),
                "groups": os.getgroups(),
                "user": pwd.getpwuid(os.getuid()).pw_name,
                "results": results,
                "own": own,
            }
        ),
        flush=True,
    )


run(TARGETS)  # noqa: F821 (set by the sender)
