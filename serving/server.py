"""The model server: Open Inference Protocol v2 over REST, with dynamic batching.

    python -m gpulab.serving.server --model-dir DIR [--ip 127.0.0.1] [--port 8000]
        [--listen-fd N] [--max-batch-size 32] [--max-latency-ms 5] [--max-queue 256]
        [--threads N] [--ssl-certfile CERT --ssl-keyfile KEY [--ssl-reload-seconds 60]]

Routes (OIP v2 plus Prometheus):

    GET  /v2                                   server metadata
    GET  /v2/health/live | /v2/health/ready    liveness, readiness
    GET  /v2/models/{name}[/versions/{v}]      model metadata (404 unknown model)
    GET  /v2/models/{name}[/versions/{v}]/ready
    POST /v2/models/{name}[/versions/{v}]/infer   JSON or binary-data extension
    GET  /metrics                              Prometheus text format

Bad requests get 400 with ``{"error": message}``, an infer call naming a model
this server does not have included (as Triton answers); the metadata of such a
model and unknown routes 404; a full queue 429. When ``GPULAB_SERVING_TOKEN``
is set (the gpulab service sets it for the replicas it starts, and is then the
only caller), every route but ``/v2/health/live`` wants ``Authorization: Bearer
<token>`` and answers 401 without it (defense in depth: the hub's login is
not here). The model runs in a thread, so the event loop keeps answering health
checks and refusing overload while a batch computes. With ``--port 0`` the
port is chosen by the system; the ``listening on`` line printed at start says it.

An embedding model (card kind ``sentence-embedding``, :mod:`.embedding`) takes its
``text`` input as ``BYTES`` (UTF-8 strings) and answers ``embedding``, FP32 ``[n, DIM]``;
its batches form in the same batcher.

``--listen-fd N`` serves on a socket the parent bound and handed over (socket
activation, as systemd does); the server listens on it once the model is loaded.
The gpulab service binds each local replica's Unix socket in a folder only root
can enter, so no other account of the host can connect to the replica, not even
its owner's other processes.

``--ssl-certfile`` and ``--ssl-keyfile`` (both or neither) serve https: a replica
reached over a network (a Kubernetes Service) is called over TLS when gpulab's TLS
is on. Both files are read at start, before the model loads, so a wrong path or a
key that does not match the certificate stops the server with that fact; a renewed
pair is loaded without a restart (:mod:`.tls`).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hmac
import json
import os
import signal
import socket
import sys
import time
import zlib

import numpy as np
import torch
import tornado.web
from tornado.httpserver import HTTPServer
from tornado.ioloop import PeriodicCallback
from tornado.netutil import bind_sockets

from .batcher import Closed, DynamicBatcher, QueueFull
from .embedding import KIND as EMBEDDING_KIND
from .embedding import EmbeddingModel
from .export import ServedModel, load_model
from .metrics import UNKNOWN_MODEL, ServingMetrics
from .oip import OIP_TO_NUMPY, BadRequest, decode_request, encode_response, model_metadata
from .tls import RELOAD_S, ServerCertificate, tls_context

SERVER_NAME = "gpulab-serving"
SERVER_VERSION = "0.1.0"
#: Connections an inherited socket lets wait to be accepted (capped by somaxconn).
LISTEN_BACKLOG = 1024


class ModelServer:
    """One model behind a dynamic batcher, and the metrics of both."""

    def __init__(
        self,
        model: ServedModel | EmbeddingModel,
        *,
        max_batch_size: int = 32,
        max_latency_ms: float = 5.0,
        max_queue: int = 256,
        token: str = "",
    ):
        card = model.card
        if max_batch_size > card.max_batch_size:
            raise ValueError(
                f"--max-batch-size {max_batch_size} is above the {card.max_batch_size} "
                f"rows {card.name!r} was exported for; lower it or re-export"
            )
        self.model = model
        self.card = card
        self.token = token
        self.metrics = ServingMetrics()
        self.ready = False
        self.batcher = DynamicBatcher(
            self._run_batch,
            max_batch_size=max_batch_size,
            max_queue_delay_ms=max_latency_ms,
            max_queue=max_queue,
            on_batch=self.metrics.batch_size.labels(model=card.name).observe,
        )
        self.metrics.track_queue(card.name, lambda: self.batcher.depth)

    def _run_batch(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if self.card.kind == EMBEDDING_KIND:  # strings in, numpy out: no tensors to make
            outputs = self.model(*inputs)
        else:
            # Arrays decoded from a request body are read-only views; torch wants writable memory.
            tensors = [torch.from_numpy(np.require(a, requirements=["C", "W"])) for a in inputs]
            outputs = [o.detach().cpu().numpy() for o in self.model(*tensors)]
        rows = inputs[0].shape[0]
        for spec, out in zip(self.card.outputs, outputs, strict=False):
            if out.shape[0] != rows:
                raise RuntimeError(
                    f"output {spec.name!r} has {out.shape[0]} rows for a batch of {rows}"
                )
        return outputs

    def warm_up(self) -> None:
        """One call before serving, so the first request does not pay for lazy setup."""
        self._run_batch(
            [
                np.array(["warm up"], dtype=object)
                if s.datatype == "BYTES"
                else np.zeros([1, *s.shape[1:]], dtype=OIP_TO_NUMPY[s.datatype])
                for s in self.card.inputs
            ]
        )

    def start(self) -> None:
        self.batcher.start()
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        await self.batcher.stop()

    def app(self) -> tornado.web.Application:
        model = r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?"
        return tornado.web.Application(
            [
                (r"/v2/?", ServerMetadataHandler, {"server": self}),
                (r"/v2/health/live", LiveHandler, {"server": self}),
                (r"/v2/health/ready", ReadyHandler, {"server": self}),
                (model + r"/?", ModelMetadataHandler, {"server": self}),
                (model + r"/ready", ModelReadyHandler, {"server": self}),
                (model + r"/infer", InferHandler, {"server": self}),
                (r"/metrics", MetricsHandler, {"server": self}),
            ],
            default_handler_class=NotFoundHandler,
            default_handler_args={"server": self},
        )


class BaseHandler(tornado.web.RequestHandler):
    def initialize(self, server: ModelServer) -> None:
        self.server = server

    def set_default_headers(self) -> None:
        self.set_header("Server", SERVER_NAME)

    def prepare(self) -> None:
        token = self.server.token
        if token and not isinstance(self, LiveHandler):
            sent = self.request.headers.get("Authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
                self.send_json(
                    {
                        "error": "this model server is reached through the gpulab "
                        "service's endpoint URL, with a hub token"
                    },
                    401,
                )

    def send_json(self, doc: dict, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(doc))

    def write_error(self, status_code: int, **kwargs) -> None:
        # Tornado's own refusals (405, a body too large, ...) answer in the API's shape too.
        self.send_json({"error": self._reason}, status_code)

    def check_model(self, name: str, version: str | None, status: int = 404) -> bool:
        card = self.server.card
        if name != card.name:
            self.send_json(
                {"error": f"unknown model {name!r}; this server has {card.name!r}"}, status
            )
            return False
        if version is not None and version != card.version:
            self.send_json(
                {"error": f"unknown version {version!r} of {name!r}; it has {card.version!r}"},
                status,
            )
            return False
        return True


class NotFoundHandler(BaseHandler):
    def prepare(self) -> None:
        super().prepare()
        if self._finished:
            return
        self.send_json(
            {
                "error": f"no route {self.request.method} {self.request.path}; "
                "see /v2 for the Open Inference Protocol routes"
            },
            404,
        )


class ServerMetadataHandler(BaseHandler):
    def get(self) -> None:
        self.send_json(
            {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": ["binary_tensor_data"]}
        )


class LiveHandler(BaseHandler):
    def get(self) -> None:
        self.send_json({"live": True})


class ReadyHandler(BaseHandler):
    def get(self) -> None:
        ready = self.server.ready
        self.send_json({"ready": ready}, 200 if ready else 503)


class ModelMetadataHandler(BaseHandler):
    def get(self, name: str, version: str | None = None) -> None:
        if self.check_model(name, version):
            self.send_json(model_metadata(self.server.card))


class ModelReadyHandler(BaseHandler):
    def get(self, name: str, version: str | None = None) -> None:
        if self.check_model(name, version):
            ready = self.server.ready
            self.send_json({"name": name, "ready": ready}, 200 if ready else 503)


def _decompress(body: bytes, encoding: str | None) -> bytes:
    if not encoding or encoding == "identity":
        return body
    try:
        if encoding == "gzip":
            return gzip.decompress(body)
        if encoding == "deflate":
            return zlib.decompress(body)
    except (OSError, EOFError, zlib.error) as exc:
        raise BadRequest(f"the body is not valid {encoding}: {exc}") from None
    raise BadRequest(f"unsupported Content-Encoding {encoding!r}; use gzip, deflate or none")


class InferHandler(BaseHandler):
    async def post(self, name: str, version: str | None = None) -> None:
        started = time.perf_counter()
        server = self.server
        label = name if name == server.card.name else UNKNOWN_MODEL
        status = await self._infer(name, version)
        server.metrics.requests.labels(model=label, code=str(status)).inc()
        if label != UNKNOWN_MODEL:
            server.metrics.duration.labels(model=label).observe(time.perf_counter() - started)

    async def _infer(self, name: str, version: str | None) -> int:
        server = self.server
        # An infer call naming another model is a bad request (400, as Triton answers);
        # metadata of a model that is not here is a missing resource (404).
        if not self.check_model(name, version, status=400):
            return 400
        if not server.ready:
            self.send_json({"error": "the model is not ready; retry shortly"}, 503)
            return 503
        try:
            body = _decompress(self.request.body, self.request.headers.get("Content-Encoding"))
            request = decode_request(
                body, self.request.headers.get("Inference-Header-Content-Length"), server.card
            )
            if request.rows > server.batcher.max_batch_size:
                raise BadRequest(
                    f"{request.rows} rows in one request exceeds the max batch size "
                    f"{server.batcher.max_batch_size}; split it"
                )
        except BadRequest as exc:
            self.send_json({"error": str(exc)}, 400)
            return 400
        try:
            outputs = await server.batcher.submit(request.inputs)
        except QueueFull as exc:
            self.set_header("Retry-After", "1")
            self.send_json({"error": str(exc)}, 429)
            return 429
        except Closed as exc:
            self.send_json({"error": str(exc)}, 503)
            return 503
        except Exception as exc:  # the model itself failed: the server's fault, not the caller's
            self.send_json({"error": f"inference failed: {type(exc).__name__}: {exc}"}, 500)
            return 500
        body, headers = encode_response(server.card, request, outputs)
        for key, value in headers.items():
            self.set_header(key, value)
        self.finish(body)
        return 200


class MetricsHandler(BaseHandler):
    def get(self) -> None:
        self.set_header("Content-Type", self.server.metrics.content_type)
        self.finish(self.server.metrics.render())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gpulab.serving.server",
        description="Serve an exported model over OIP v2 with dynamic batching.",
    )
    parser.add_argument(
        "--model-dir",
        required=True,
        help="a directory written by gpulab.serving.export.export_model",
    )
    parser.add_argument(
        "--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="port; 0 picks a free one (default 8000)"
    )
    parser.add_argument(
        "--listen-fd",
        type=int,
        default=None,
        help="serve on this inherited listening socket (a Unix socket the gpulab "
        "service bound) instead of --ip/--port",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=32,
        help="most rows the model runs at once (default 32; 1 turns batching off)",
    )
    parser.add_argument(
        "--max-latency-ms",
        type=float,
        default=5.0,
        help="longest a request waits for others to join its batch (default 5)",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=256,
        help="requests allowed to wait; beyond it the server answers 429 (default 256)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads for inference (default: torch's choice)",
    )
    parser.add_argument(
        "--max-body-mib",
        type=float,
        default=256,
        help="largest request body accepted, MiB (default 256)",
    )
    parser.add_argument(
        "--ssl-certfile",
        default=None,
        help="serve https with this PEM certificate (and its chain); needs --ssl-keyfile",
    )
    parser.add_argument(
        "--ssl-keyfile",
        default=None,
        help="the PEM private key of --ssl-certfile",
    )
    parser.add_argument(
        "--ssl-reload-seconds",
        type=float,
        default=RELOAD_S,
        help="how often the certificate files are checked for a renewal and loaded "
        f"again (default {RELOAD_S:g})",
    )
    return parser.parse_args(argv)


def listening_sockets(
    args: argparse.Namespace, scheme: str = "http"
) -> tuple[list[socket.socket], str]:
    """The sockets to serve on and where they are, in words (``unix:PATH`` or a URL
    of ``scheme``)."""
    if args.listen_fd is None:
        sockets = bind_sockets(args.port, args.ip)
        return sockets, f"{scheme}://{args.ip}:{sockets[0].getsockname()[1]}"
    try:
        sock = socket.socket(fileno=args.listen_fd)
    except OSError as exc:
        raise ValueError(f"--listen-fd {args.listen_fd} is not an open socket: {exc}") from None
    # The parent bound it and left the listening to us: connections made before the
    # model is loaded are refused, not left waiting (readiness probes fail fast).
    sock.listen(LISTEN_BACKLOG)
    sock.setblocking(False)
    name = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return [sock], f"unix:{name.decode() if isinstance(name, bytes) else name}"
    return [sock], f"{scheme}://{name[0]}:{name[1]}"


async def serve(args: argparse.Namespace) -> None:
    tls = tls_context(args.ssl_certfile, args.ssl_keyfile)  # before the (slow) model load
    certificate = ServerCertificate(tls, args.ssl_certfile, args.ssl_keyfile) if tls else None
    if args.threads:
        torch.set_num_threads(args.threads)
    # A replica has every file of its model and may have no network: an embedding
    # model's libraries must not try the Hugging Face hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        model = load_model(args.model_dir)
    except (FileNotFoundError, ImportError):
        raise
    except Exception as exc:  # a corrupt or foreign file: say which, not a traceback
        raise ValueError(
            f"cannot load the model in {args.model_dir}: {type(exc).__name__}: {exc}"
        ) from exc
    server = ModelServer(
        model,
        max_batch_size=args.max_batch_size,
        max_latency_ms=args.max_latency_ms,
        max_queue=args.max_queue,
        token=os.environ.pop("GPULAB_SERVING_TOKEN", ""),
    )
    server.warm_up()
    sockets, where = listening_sockets(args, "https" if tls else "http")
    http = HTTPServer(server.app(), max_body_size=int(args.max_body_mib * 2**20), ssl_options=tls)
    http.add_sockets(sockets)
    server.start()
    if certificate is not None:  # a renewed certificate (cert-manager's) without a restart
        reload = PeriodicCallback(
            certificate.reload_if_changed, max(args.ssl_reload_seconds, 0.1) * 1000
        )
        reload.start()
    print(f"{SERVER_NAME}: model {server.card.name!r} listening on {where}", flush=True)

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    http.stop()  # no new connections; queued requests are still answered
    await server.stop()
    await http.close_all_connections()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for flag in ("max_batch_size", "max_queue"):
        if getattr(args, flag) < 1:
            print(f"--{flag.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    try:
        asyncio.run(serve(args))
    except (FileNotFoundError, ImportError, ValueError) as exc:
        print(f"{SERVER_NAME}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    # Every connection is closed and every batch answered by now; skip the seconds
    # the interpreter spends tearing down torch's modules, so restarts are quick.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
