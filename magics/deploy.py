"""``%deploy``: serve a model from the notebook as an authenticated OIP v2 endpoint.

    %deploy qmodel --name sentiment --example x --max-batch-size 32 --max-latency-ms 5 \
        --gpu 0.25 --replicas 1:4 --scale-down-delay 300
    %deploy qmodel2 --name sentiment --example x --canary 10 [--auto-rollback 5]
    %deploy --promote sentiment        (or --rollback sentiment)
    %deploy --list                     (refreshes in place until the next cell)
    %deploy --list --lineage           (each version's job, code hash, data, quantization)
    %deploy --stop sentiment
    %deploy model --name chat --tokenizer tok --gpu 1/2   (a causal LM: OpenAI-compatible,
        at <hub>/services/gpulab/v1; magics/llm_deploy.py)
    %deploy model --name chat --tokenizer tok --adapter sql=sql_lora   (LoRA adapters: each
        answers as model chat:sql on the same replicas; magics/llm_adapters.py)
    %deploy --logs sentiment           (the first replica's log: why it did not start)

The model is exported here, in the kernel (``torch.export``, dynamic batch),
uploaded to the gpulab service, which places a slice per replica and starts
the model servers; the magic waits until they answer, then prints the URL, a
curl line and a ``tritonclient`` snippet. Calls need a hub token.

``--replicas MIN:MAX`` lets the service add replicas when calls in flight pass
``--target-inflight`` per replica and remove them ``--scale-down-delay`` seconds
after they are no longer needed; ``MIN`` 0 gives every slice back when idle (the
next call then waits for a cold start).
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from gpulab.client.units import plural

from . import llm_adapters
from . import llm_deploy as llm
from .deploy_failure import DeploymentFailed
from .deploy_list import list_table
from .deploy_live import DeploymentsTable, LiveTable, did_you_mean
from .lineage import lineage_of, untracked
from .llm_deploy import wants_llm_route
from .quantize import model_and_example
from .train import parse_gpu

WAIT_S = 300.0


def _replica_log(client, dep: dict, version: int | None) -> str:
    """Replica 0's log of ``version``, to say why it did not start ("" if unreadable:
    the service's message still says what happened)."""
    from gpulab.client import GpuLabError

    try:
        return client.deployment_logs(dep["name"], 0, dep.get("user"), version)
    except GpuLabError:
        return ""


def _csv(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def _own_ca(scheme: str) -> bool:
    """The hub's certificate is from gpulab's own CA (gpulab up --tls self-signed)."""
    return scheme == "https" and bool(os.environ.get("GPULAB_CA_FILE"))


def _tls_arguments(scheme: str) -> str:
    if _own_ca(scheme):
        return ', ssl=True, ssl_options={"ca_certs": os.environ["GPULAB_CA_FILE"]}'
    return ", ssl=True" if scheme == "https" else ""


def _curl_ca(scheme: str) -> str:
    return ' --cacert "$GPULAB_CA_FILE"' if _own_ca(scheme) else ""


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
            f'  curl{_curl_ca(scheme)} -H "Authorization: token $JUPYTERHUB_API_TOKEN" '
            f"-H 'Content-Type: application/json' \\\n    -d '{body}' \\\n    {infer}",
            "",
            "tritonclient:",
            "  import os, tritonclient.http as httpclient",
            f"  client = httpclient.InferenceServerClient({rest!r}{_tls_arguments(scheme)})",
            f"  # {arrays} = numpy arrays with the example's shapes and dtypes",
            *[f"  {line}" for block in ins for line in block.splitlines()],
            f"  result = client.infer({name!r}, [{input_names}],",
            "                        headers={'Authorization': "
            "f\"token {os.environ['JUPYTERHUB_API_TOKEN']}\"})",
            f"  result.as_numpy({out!r})",
        ]
    )


def parse_replicas(text: str) -> tuple[int, int]:
    """``N`` (a fixed count) or ``MIN:MAX`` (autoscaling)."""
    low, sep, high = text.partition(":")
    try:
        lo, hi = int(low), int(high) if sep else int(low)
    except ValueError:
        raise UsageError(
            f"--replicas {text!r}: give a count (2) or a range MIN:MAX (0:4)"
        ) from None
    if lo < 0 or hi < max(lo, 1):
        raise UsageError(f"--replicas {text!r}: need 0 <= MIN <= MAX and MAX >= 1")
    return lo, hi


@magics_class
class DeployMagics(Magics):
    @magic_arguments()
    @argument(
        "model",
        nargs="?",
        help="the torch.nn.Module to serve; for a language model, a transformers causal LM "
        "in the notebook, a saved folder or a Hugging Face id in the local cache",
    )
    @argument("--name", help="the endpoint's name (lower-case letters, digits, '-', '_', '.')")
    @argument("--example", help="an input batch: a variable or expression (tensor or tuple)")
    @argument(
        "--tokenizer",
        help="a language model's tokenizer: a variable, a saved folder or a Hugging Face id "
        "(default: the model's own folder or id); serves it at <hub>/services/gpulab/v1",
    )
    @argument(
        "--adapter",
        action="append",
        default=None,
        metavar="NAME=PEFT",
        help="a LoRA adapter served with the language model as model NAME:ADAPTER on the "
        "same replicas: a PEFT model in the notebook or a folder it saved; repeatable. A "
        "PEFT MODEL brings its own adapters",
    )
    @argument(
        "--max-model-len",
        type=int,
        default=None,
        help="a language model's longest prompt plus completion in tokens "
        "(default: the model's own limit)",
    )
    @argument(
        "--max-num-seqs",
        type=int,
        default=16,
        help="a language model's sequences generated together per replica (default 16)",
    )
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
    @argument(
        "--gpu", default=None, help="GPU per replica: 0 (CPU), 0.1, 1/4, 0.5, 1...; default 0"
    )
    @argument(
        "--replicas",
        default="1",
        help="model servers behind the endpoint: a count (2), or MIN:MAX to scale with "
        "the calls in flight (0:4; MIN 0 frees every slice when idle). Default 1",
    )
    @argument(
        "--target-inflight",
        type=float,
        default=None,
        help="calls in flight per replica the autoscaler aims for (default: the batch size)",
    )
    @argument(
        "--scale-down-delay",
        type=float,
        default=None,
        help="seconds a replica stays after it is no longer needed (default 300)",
    )
    @argument(
        "--canary",
        type=int,
        metavar="PERCENT",
        help="start this model as a new version of the existing endpoint --name, "
        "with PERCENT of the calls",
    )
    @argument(
        "--auto-rollback",
        type=float,
        metavar="POINTS",
        help="roll a canary back by itself when its error rate passes the stable "
        "version's by POINTS percentage points",
    )
    @argument("--promote", metavar="NAME", help="give endpoint NAME's canary every call")
    @argument("--rollback", metavar="NAME", help="give endpoint NAME's stable version every call")
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
    @argument(
        "--list",
        action="store_true",
        help="list your endpoints (admins: everyone's); the table refreshes in place every "
        "5 s for 10 minutes, until the next cell runs",
    )
    @argument("--once", action="store_true", help="with --list: show the table once")
    @argument(
        "--lineage",
        action="store_true",
        help="with --list: under each version, where its model came from (job, code hash, "
        "dataset versions, quantization)",
    )
    @argument("--stop", metavar="NAME", help="stop endpoint NAME and free its slices")
    @argument(
        "--logs",
        metavar="NAME",
        help="print the log of endpoint NAME's first replica (why it did not start)",
    )
    @line_magic
    def deploy(self, line: str = ""):
        """Serve a model as an authenticated OIP v2 endpoint with dynamic batching."""
        args = parse_argstring(self.deploy, line)
        from gpulab.client import Client, GpuLabError

        try:
            client = Client()
            if args.list:
                self._list(client, once=args.once, lineage=args.lineage)
                return
            if args.lineage:
                raise UsageError("--lineage goes with --list: %deploy --list --lineage")
            named = args.stop or args.promote or args.rollback or args.logs
            if named:
                self._check_name(client, named)
            if args.logs:
                print(client.deployment_logs(args.logs), end="")
                return
            if args.stop:
                dep = client.stop_deployment(args.stop)
                # The latest table shown says so (it stopped refreshing when this cell ran).
                if isinstance(LiveTable.current, DeploymentsTable):
                    LiveTable.current.mark_stopped(dep["name"], dep.get("user"))
                print(
                    f"stopped {dep['name']}: {plural(dep['replicas'], 'replica')} stopped, "
                    f"{'its slice' if dep['replicas'] == 1 else 'their slices'} released"
                )
                return
            if args.promote or args.rollback:
                name = args.promote or args.rollback
                if args.promote:
                    dep = client.promote_deployment(name)
                else:
                    dep = client.rollback_deployment(name)
                (v,) = dep["versions"]
                print(
                    f"{name}: version {v['version']} takes every call; the other "
                    f"version stopped and its slices were released"
                )
                return
            return self._deploy(client, args)
        except GpuLabError as e:
            raise UsageError(f"gpulab service: {e}") from None

    def _list(self, client, once: bool, lineage: bool = False) -> None:
        """The table; in a kernel, kept current in place (``deploy_live.LiveTable``)."""
        if once or getattr(self.shell, "kernel", None) is None:
            # A terminal: no display updates.
            print(list_table(client.list_deployments(), lineage=lineage))
            return
        DeploymentsTable(client.list_deployments, lineage=lineage).show()

    @staticmethod
    def _check_name(client, name: str) -> None:
        """An unknown name is refused with the close ones (``did you mean``) before the
        service is asked to act on it."""
        names = [d["name"] for d in client.list_deployments()]
        if name not in names:
            raise UsageError(did_you_mean("deployment", name, names))

    def _deploy(self, client, args):
        from gpulab.serving.embedding import is_sentence_transformer

        ns = self.shell.user_ns
        if (
            wants_llm_route(ns, args.model, args.tokenizer)
            or args.adapter
            or llm_adapters.is_peft_model(ns.get(args.model))
        ):
            return self._deploy_llm(client, args)
        # A SentenceTransformer takes text (it has its own tokenizer): no --example.
        text_model = is_sentence_transformer(ns.get(args.model))
        if not args.model or not args.name or not (args.example or text_model):
            raise UsageError(
                "usage: %deploy MODEL --name NAME --example X [options]; "
                "%deploy --list; %deploy --stop NAME (%deploy? for all options)"
            )
        if text_model:
            example = ["a sentence to embed"]  # for the printed usage lines only
        else:
            example = model_and_example(ns, args.model, args.example)
        settings = self._settings(args)
        # Where the model came from (its job, its quantization), or explicitly nothing.
        settings["lineage"] = lineage_of(ns[args.model]) or untracked()

        from gpulab.serving.export import ExportError, export_model

        with tempfile.TemporaryDirectory(prefix="gpulab-deploy-") as model_dir:
            how = "sentence-transformers" if text_model else "torch.export"
            print(f"exporting {args.model} ({how}, batch 1..{args.max_batch_size})...", flush=True)
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
            self._replace_previous(client, args)
            print("uploading and starting...", flush=True)
            dep = client.create_deployment(model_dir, settings)
        dep = self._wait(client, dep, canary=args.canary is not None)
        url = client.endpoint_url(dep)
        tensors = example if isinstance(example, (tuple, list)) else (example,)
        if text_model:
            import numpy as np

            arrays = [np.array(example, dtype=object)]
        else:
            arrays = [t.detach().cpu().numpy() for t in tensors]
        print(usage_lines(dep, url, arrays))
        return None

    @staticmethod
    def _replace_previous(client, args) -> None:
        """--replace (without --canary): stop the endpoint of that name first, if any."""
        from gpulab.client import GpuLabError

        if args.replace and args.canary is None:
            try:
                client.stop_deployment(args.name)
                print(f"stopped the previous {args.name}", flush=True)
            except GpuLabError as e:
                if e.status != 404:
                    raise

    def _deploy_llm(self, client, args):
        """A causal LM: its Hugging Face folder and tokenizer, served behind the
        OpenAI-compatible gateway (magics/llm_deploy.py)."""
        if not args.name:
            raise UsageError("usage: %deploy MODEL --name NAME --tokenizer TOK [--gpu 1/2]")
        if args.example:
            raise UsageError(
                "--example is for tensor models; a language model takes text: drop --example"
            )
        for flag, value in (
            ("--max-model-len", args.max_model_len),
            ("--max-num-seqs", args.max_num_seqs),
        ):
            if value is not None and value < 1:
                raise UsageError(f"{flag} {value}: give a positive number of tokens/sequences")
        ns = self.shell.user_ns
        flags = llm_adapters.parse(args.adapter)
        obj = ns.get(args.model)
        peft = llm_adapters.is_peft_model(obj)
        # A PEFT model: its base is served, its adapters beside it (magics/llm_adapters.py).
        model = llm_adapters.base_of(obj) if peft else llm.resolve_model(ns, args.model)
        tokenizer = llm.resolve_tokenizer(ns, args.tokenizer, args.model, model)
        settings = self._settings(args)
        # The replica's sequences in flight are its "batch" for autoscaling and queueing.
        settings["max_batch_size"] = args.max_num_seqs
        settings["lineage"] = (lineage_of(obj) if obj is not None else None) or untracked()

        with tempfile.TemporaryDirectory(prefix="gpulab-deploy-") as model_dir:
            params = sum(p.numel() for p in model.parameters())
            print(
                f"saving {args.model} (causal LM, {params / 1e6:.1f}M parameters, "
                f"with its tokenizer)...",
                flush=True,
            )
            adapters = llm_adapters.sources(
                ns, obj if peft else None, flags, os.path.join(model_dir, "peft")
            )
            llm.write_archive(model, tokenizer, model_dir, args, adapters)
            self._replace_previous(client, args)
            print("uploading and starting...", flush=True)
            dep = client.create_deployment(model_dir, settings)
        dep = self._wait(client, dep, canary=args.canary is not None)
        base = llm.gateway_url(client.endpoint_url(dep))
        model_id = llm.model_id(dep, dep.get("user"))
        print(llm.llm_usage_lines(dep, base, model_id))
        if adapters:
            names = ", ".join(f"{model_id}:{a}" for a in sorted(adapters))
            print(f"LoRA adapters, each a model of its own on the same replicas: {names}")
        return None

    @staticmethod
    def _settings(args) -> dict:
        """The spec sent with the model: a new deployment's, or a canary's."""
        batching = {
            "max_batch_size": args.max_batch_size,
            "max_latency_ms": args.max_latency_ms,
            "max_queue": args.max_queue,
        }
        if args.canary is not None:
            if not 1 <= args.canary <= 99:
                raise UsageError("--canary takes a percentage of calls from 1 to 99")
            settings = {"name": args.name, "canary": args.canary, **batching}
            if args.gpu is not None:
                settings["gpu_milli"] = parse_gpu(args.gpu)
            return settings
        low, high = parse_replicas(args.replicas)
        settings = {
            "name": args.name,
            "min_replicas": low,
            "max_replicas": high,
            "gpu_milli": parse_gpu(args.gpu or "0"),
            **batching,
            "share_users": _csv(args.share_with),
            "share_groups": _csv(args.share_groups),
        }
        for key, value in (
            ("target_inflight", args.target_inflight),
            ("scale_down_delay_s", args.scale_down_delay),
            ("rollback_margin", None if args.auto_rollback is None else args.auto_rollback / 100),
            ("stop_with_server", args.stop_with_server),
        ):
            if value is not None:
                settings[key] = value
        return settings

    @staticmethod
    def _wait(client, dep: dict, canary: bool = False) -> dict:
        """Poll until every replica of the new version answers (or it fails); show
        each change."""
        deadline = time.monotonic() + WAIT_S
        shown = None
        while True:
            v = dep["versions"][-1] if dep.get("versions") else dep
            label = f"{dep['name']} version {v.get('version', 1)}" if canary else dep["name"]
            # "freeing a slice: ..." while batch jobs stop to make room, then replicas.
            freeing = v["message"] if v["message"].startswith("freeing") else ""
            now = (v["state"], v["replicas_ready"], freeing[:40])
            if now != shown:
                print(
                    f"{label}: {v['state']}, {v['replicas_ready']}/"
                    f"{plural(v['replicas'], 'replica')} ready"
                    + (f" ({freeing})" if freeing else ""),
                    flush=True,
                )
                shown = now
            if v["state"] == "running":
                if canary:
                    print(
                        f"{dep['name']}: version {v['version']} gets {v['weight']}% of "
                        f"calls; %deploy --promote {dep['name']} or --rollback {dep['name']}",
                        flush=True,
                    )
                return dep
            if v["state"] == "failed":
                log = _replica_log(client, dep, v.get("version"))
                raise DeploymentFailed(label, dep["name"], v["message"], log)
            if time.monotonic() > deadline:
                log = _replica_log(client, dep, v.get("version"))
                raise DeploymentFailed(
                    label, dep["name"], f"{WAIT_S:g} s; {v['message']}", log, timed_out=True
                )
            time.sleep(0.5)
            dep = client.get_deployment(dep["name"])
