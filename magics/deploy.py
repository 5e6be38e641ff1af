"""``%deploy``: serve a model from the notebook as an authenticated OIP v2 endpoint.

    %deploy qmodel --name sentiment --example x --max-batch-size 32 --max-latency-ms 5 \
        --gpu 0.25 --replicas 2
    %deploy --list
    %deploy --stop sentiment

The model is exported here, in the kernel (``torch.export``, dynamic batch),
uploaded to the gpulab service, which places a slice per replica and starts
the model servers; the magic waits until they answer, then prints the URL, a
curl line and a ``tritonclient`` snippet. Calls need a hub token.
"""

from __future__ import annotations

import json
import tempfile
import time

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .quantize import model_and_example
from .train import parse_gpu

WAIT_S = 300.0


def _csv(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def usage_lines(dep: dict, url: str, example_arrays: list) -> str:
    """The URL, a curl line and a tritonclient snippet for a running deployment."""
    model = dep.get("model") or {}
    inputs = model.get("inputs") or []
    outputs = model.get("outputs") or []
    name = dep["name"]
    infer = f"{url}/v2/models/{name}/infer"
    rows = []
    for spec, arr in zip(inputs, example_arrays, strict=False):
        one = arr[:1]
        rows.append(
            {
                "name": spec["name"],
                "shape": list(one.shape),
                "datatype": spec["datatype"],
                "data": one.reshape(-1).tolist() if one.size <= 16 else "...",
            }
        )
    body = json.dumps({"inputs": rows})
    scheme, _, rest = url.partition("://")
    ins = []
    for i, spec in enumerate(inputs):
        ins.append(
            f"inp{i} = httpclient.InferInput({spec['name']!r}, list(x{i}.shape), "
            f"{spec['datatype']!r})\ninp{i}.set_data_from_numpy(x{i})"
        )
    arrays = ", ".join(f"x{i}" for i in range(len(inputs)))
    input_names = ", ".join(f"inp{i}" for i in range(len(inputs)))
    out = outputs[0]["name"] if outputs else "output0"
    return "\n".join(
        [
            f"endpoint: {url}",
            f"infer:    POST {infer}",
            "",
            "curl (JSON; any hub token of yours or of someone it is shared with):",
            f'  curl -H "Authorization: token $JUPYTERHUB_API_TOKEN" '
            f"-H 'Content-Type: application/json' \\\n    -d '{body}' \\\n    {infer}",
            "",
            "tritonclient:",
            "  import os, tritonclient.http as httpclient",
            f"  client = httpclient.InferenceServerClient({rest!r}"
            + (", ssl=True)" if scheme == "https" else ")"),
            f"  # {arrays} = numpy arrays with the example's shapes and dtypes",
            *[f"  {line}" for block in ins for line in block.splitlines()],
            f"  result = client.infer({name!r}, [{input_names}],",
            "                        headers={'Authorization': "
            "f\"token {os.environ['JUPYTERHUB_API_TOKEN']}\"})",
            f"  result.as_numpy({out!r})",
        ]
    )


def list_table(deps: list[dict]) -> str:
    if not deps:
        return "no deployments (start one with %deploy MODEL --name NAME --example X)"
    head = (
        f"{'name':<20} {'user':<12} {'state':<9} {'replicas':>8} {'gpu':>6} "
        f"{'req/s':>7} {'p99 ms':>7}  path"
    )
    lines = [head, "-" * len(head)]
    for d in deps:
        p99, rps = d.get("p99_latency_ms"), d.get("requests_per_second")
        lines.append(
            f"{d['name']:<20} {d['user']:<12} {d['state']:<9} "
            f"{d['replicas_ready']:>3}/{d['replicas']:<4} {d['gpu_milli'] / 1000:>6g} "
            f"{(f'{rps:.1f}' if rps is not None else '-'):>7} "
            f"{(f'{p99:.1f}' if p99 is not None else '-'):>7}  {d['path']}"
        )
        if d["state"] in ("failed", "degraded"):
            lines.append(f"    {d['message']}")
    return "\n".join(lines)


@magics_class
class DeployMagics(Magics):
    @magic_arguments()
    @argument("model", nargs="?", help="name of the torch.nn.Module to serve")
    @argument("--name", help="the endpoint's name (lower-case letters, digits, '-', '_', '.')")
    @argument("--example", help="an input batch: a variable or expression (tensor or tuple)")
    @argument(
        "--max-batch-size",
        type=int,
        default=32,
        help="most requests run together (default 32; 1 turns batching off)",
    )
    @argument(
        "--max-latency-ms",
        type=float,
        default=5.0,
        help="longest a request waits for others to join its batch (default 5)",
    )
    @argument(
        "--max-queue",
        type=int,
        default=256,
        help="requests allowed to wait; beyond it callers get 429 (default 256)",
    )
    @argument("--gpu", default="0", help="GPU per replica: 0 (CPU), 0.1, 1/4, 0.5, 1...; default 0")
    @argument(
        "--replicas", type=int, default=1, help="model servers behind the endpoint (default 1)"
    )
    @argument("--share-with", default="", help="comma-separated users who may call it too")
    @argument("--share-groups", default="", help="comma-separated hub groups who may call it too")
    @argument(
        "--stop-with-server",
        action="store_true",
        default=None,
        help="stop the endpoint when this server stops",
    )
    @argument(
        "--keep-running",
        dest="stop_with_server",
        action="store_false",
        help="keep the endpoint when this server stops (overrides the site default)",
    )
    @argument("--replace", action="store_true", help="stop an endpoint of the same name first")
    @argument("--list", action="store_true", help="list your endpoints (admins: everyone's)")
    @argument("--stop", metavar="NAME", help="stop endpoint NAME and free its slices")
    @line_magic
    def deploy(self, line: str = ""):
        """Serve a model as an authenticated OIP v2 endpoint with dynamic batching."""
        args = parse_argstring(self.deploy, line)
        from gpulab.client import Client, GpuLabError

        try:
            client = Client()
            if args.list:
                print(list_table(client.list_deployments()))
                return
            if args.stop:
                dep = client.stop_deployment(args.stop)
                print(
                    f"stopped {dep['name']}: {dep['replicas']} replica(s) and their "
                    f"slice(s) released"
                )
                return
            return self._deploy(client, args)
        except GpuLabError as e:
            raise UsageError(f"gpulab service: {e}") from None

    def _deploy(self, client, args):
        if not args.model or not args.name or not args.example:
            raise UsageError(
                "usage: %deploy MODEL --name NAME --example X [options]; "
                "%deploy --list; %deploy --stop NAME (%deploy? for all options)"
            )
        ns = self.shell.user_ns
        example = model_and_example(ns, args.model, args.example)
        if args.replicas < 1:
            raise UsageError("--replicas must be at least 1")
        settings = {
            "name": args.name,
            "replicas": args.replicas,
            "gpu_milli": parse_gpu(args.gpu),
            "max_batch_size": args.max_batch_size,
            "max_latency_ms": args.max_latency_ms,
            "max_queue": args.max_queue,
            "share_users": _csv(args.share_with),
            "share_groups": _csv(args.share_groups),
        }
        if args.stop_with_server is not None:
            settings["stop_with_server"] = args.stop_with_server

        from gpulab.client import GpuLabError
        from gpulab.serving.export import ExportError, export_model

        with tempfile.TemporaryDirectory(prefix="gpulab-deploy-") as model_dir:
            print(
                f"exporting {args.model} (torch.export, batch 1..{args.max_batch_size})...",
                flush=True,
            )
            try:
                export_model(
                    ns[args.model],
                    example,
                    model_dir,
                    name=args.name,
                    max_batch_size=max(args.max_batch_size, 2),
                )
            except ExportError as e:
                raise UsageError(str(e)) from None
            if args.replace:
                try:
                    client.stop_deployment(args.name)
                    print(f"stopped the previous {args.name}", flush=True)
                except GpuLabError as e:
                    if e.status != 404:
                        raise
            print("uploading and starting...", flush=True)
            dep = client.create_deployment(model_dir, settings)
        dep = self._wait(client, dep)
        url = client.endpoint_url(dep)
        tensors = example if isinstance(example, (tuple, list)) else (example,)
        print(usage_lines(dep, url, [t.detach().cpu().numpy() for t in tensors]))
        return None

    @staticmethod
    def _wait(client, dep: dict) -> dict:
        """Poll until every replica answers (or the deployment fails); show each change."""
        deadline = time.monotonic() + WAIT_S
        shown = None
        while True:
            # "freeing a slice: ..." while batch jobs stop to make room, then replicas.
            freeing = dep["message"] if dep["message"].startswith("freeing") else ""
            now = (dep["state"], dep["replicas_ready"], freeing[:40])
            if now != shown:
                print(
                    f"{dep['name']}: {dep['state']}, {dep['replicas_ready']}/"
                    f"{dep['replicas']} replica(s) ready" + (f" ({freeing})" if freeing else ""),
                    flush=True,
                )
                shown = now
            if dep["state"] == "running":
                return dep
            if dep["state"] == "failed":
                raise UsageError(f"deployment {dep['name']} failed: {dep['message']}")
            if time.monotonic() > deadline:
                raise UsageError(
                    f"{dep['name']} is not ready after {WAIT_S:g} s "
                    f"({dep['message']}); see %deploy --list, or stop it with "
                    f"%deploy --stop {dep['name']}"
                )
            time.sleep(0.5)
            dep = client.get_deployment(dep["name"])
