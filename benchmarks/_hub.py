"""Benchmarks start real hubs with the same helper the tests use."""

import contextlib
import os
import sys

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)

from hubproc import RunningHub  # noqa: E402,F401


def percentile(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


@contextlib.contextmanager
def serving_hub(work: str, dims: list[int], tls: bool = False):
    """A real hub (two simulated A100s) with the user "bench", and an MLP of ``dims``
    built in ``work``: yields ``(hub, client, token, model_dir)``. With ``tls`` the hub
    is ``gpulab up --tls self-signed`` (https only, its CA at ``hub.ca``, which the
    client trusts) and its user is "bench-tls", so that it can run beside a plain hub
    of the same ``work`` (both share the model, each has its own data dir). The hub
    stops on exit; on an error the end of its log is printed first."""
    from serving_batching import build_model

    from gpulab.client import Client

    hub = RunningHub(
        os.path.join(work, "hub-tls" if tls else "hub"),
        simulate="2xA100-80GB",
        tls=tls,
        # The scale-down delay a benchmark names is the one it measures (a site's
        # GPU endpoints wait at least 60 s by default).
        config="c.Endpoints.min_gpu_scale_down_delay_s = 0\n",
    )
    try:
        token = hub.create_user("bench-tls" if tls else "bench")
        model_dir = os.path.join(work, "mlp")
        if not os.path.exists(os.path.join(model_dir, "model.json")):
            build_model(dims, model_dir)
        client = Client(hub.api, token=token, ca_file=str(hub.ca) if tls else None)
        yield hub, client, token, model_dir
    except Exception:
        print(f"the hub's log ends:\n{hub.log_tail(6000)}", file=sys.stderr)
        raise
    finally:
        hub.stop()
