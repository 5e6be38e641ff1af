"""Routes for model endpoints: ``/api/v1/deployments`` and the endpoints themselves.

Management (owner and admins; to anyone else a deployment does not exist)::

    GET    api/v1/deployments[?user=]            list
    POST   api/v1/deployments                    multipart: "spec" (JSON) + "model" (tar);
                                                 with "canary": P in the spec, a new
                                                 version of an existing deployment
    GET    api/v1/deployments/{name}[?user=]     one, with its versions, requests/s, p99
    PATCH  api/v1/deployments/{name}[?user=]     sharing, stop_with_server
    DELETE api/v1/deployments/{name}[?user=]     stop, release the slices
    POST   api/v1/deployments/{name}/promote     the canary takes every call
    POST   api/v1/deployments/{name}/rollback    the stable version takes every call
    GET    api/v1/deployments/{name}/logs[?replica=0&version=N]

The catalog (any user: the endpoints they may call)::

    GET    api/v1/models
    GET    api/v1/models/{owner}/{name}/lineage   where each version's model came from
                                                  (same access as calling it)

The endpoint (OIP v2; owner, admins and those it is shared with)::

    <hub>/services/gpulab/endpoints/{user}/{name}/v2/...

is answered by the endpoint router (:mod:`gpulab.service.endpoints.router`) where the hub's
proxy routes to it, else by :class:`EndpointHandler` here; both forward to a
ready replica with the replicas' own secret: the caller's hub token never
reaches the model server.
"""

from __future__ import annotations

import asyncio
import logging

from tornado import web
from tornado.iostream import StreamClosedError

from gpulab.scheduler.budget import BudgetExceeded
from gpulab.scheduler.slices import SliceError, parse_gpu_milli
from gpulab.service.api.query_args import int_arg
from gpulab.service.api.request_body import parse_json_object
from gpulab.service.auth import APIHandler
from gpulab.service.endpoints.call_bytes import NoRoom
from gpulab.service.endpoints.calls import MAX_CALL_MIB, CallRefused
from gpulab.service.endpoints.lineage import audit_summary, model_lineage
from gpulab.service.endpoints.manager import DeploymentManager, DeployRefused, upload_spool
from gpulab.service.endpoints.openai_gateway import WRITE_TIMEOUT_S
from gpulab.service.endpoints.router import (
    WRITE_SLICE,
    answer_headers,
    call_limit,
    forwarded_headers,
)
from gpulab.service.endpoints.uploads import MultipartUpload, boundary_of

log = logging.getLogger("gpulab.service.endpoints.manager")


class _DeploymentHandler(APIHandler):
    @property
    def deployments(self) -> DeploymentManager:
        manager = self.gpulab.deployments
        if manager is None:
            raise web.HTTPError(503, "the deployment manager is still starting; try again")
        return manager

    def find(self, name: str) -> dict:
        """The caller's deployment ``name`` (admins: ``?user=``'s)."""
        who = self.require_identity()
        user = self.get_argument("user", None) or who.name
        dep = self.deployments.store.find(user, name)
        if dep is None or not who.can_act_for(dep["user"]):
            raise web.HTTPError(
                404, f"no deployment {name!r}" + (f" of {user}" if user != who.name else "")
            )
        return dep


class DeploymentsHandler(_DeploymentHandler):
    """``POST``: the model streams to a spool file as it arrives
    (:mod:`gpulab.service.endpoints.uploads`)."""

    body_setting = "max_upload_mib"
    body_in_memory = False  # the upload goes to disk as it comes
    audit_actions = {"POST": "deployment.create"}

    def body_limit(self) -> int:
        if self.request.method == "POST":
            return self.gpulab.max_upload_mib * 2**20
        return super().body_limit()

    async def prepare(self):
        self.upload = None
        await super().prepare()
        if self.request.method != "POST" or self._refusal is not None:
            return
        # Everything that can be refused is decided before a byte of the upload is
        # kept (the body is then dropped as it comes, and the refusal answered).
        try:
            who = self.require_identity()
            self.deployments.check_may_deploy(who)
            boundary = boundary_of(self.request.headers.get("Content-Type", ""))
        except DeployRefused as e:
            self.refuse_after_body(web.HTTPError(e.status, str(e)))
            return
        except web.HTTPError as e:
            self.refuse_after_body(e)
            return
        self.upload = MultipartUpload(
            boundary,
            upload_spool(self.gpulab.data_dir),
            "model",
            self.body_limit(),
            self.body_setting,
            fields=("spec",),
        )

    def _milli_of(self, who, settings: dict) -> int:
        """The slice the version will hold, as the manager will read it: ``"1000"`` is
        1000, and a canary without one takes its deployment's (a bad value is the
        manager's 400: 0 here)."""
        asked = settings.get("gpu_milli")
        if asked is None and "canary" in settings:
            current = self.deployments.store.find(who.name, str(settings.get("name", "")))
            asked = current["gpu_milli"] if current else 0
        try:
            return parse_gpu_milli(asked if asked is not None else 0)
        except SliceError:
            return 0

    def data_received(self, chunk: bytes) -> None:
        if self.upload is not None:
            self.upload.feed(chunk)

    def on_connection_close(self):
        if self.upload is not None:  # the client went away mid-upload
            self.upload.cleanup()
        super().on_connection_close()

    def get(self):
        user = self.listed_user("deployments")
        self.write_json([self.deployments.view(d) for d in self.deployments.store.list(user=user)])

    async def post(self):
        self.raise_refusal()
        who = self.require_identity()
        try:
            self.upload.finish()
            spec = self.upload.fields.get("spec")
            if spec is None or self.upload.file_path is None:
                raise web.HTTPError(
                    400,
                    "send multipart/form-data with a 'spec' field (JSON "
                    "settings) and a 'model' file (a tar of the exported "
                    "model directory); %deploy does this for you",
                )
            settings = parse_json_object(spec, "'spec'")
            try:
                # Any GPU the new version will hold costs GPU-hours.
                await self.gpulab.budgets.refuse_over_budget(
                    who.name, await asyncio.to_thread(self._milli_of, who, settings)
                )
            except BudgetExceeded as e:
                raise web.HTTPError(403, str(e)) from None
            try:
                dep = await self.deployments.create(who, settings, self.upload.file_path)
            except DeployRefused as e:
                raise web.HTTPError(e.status, str(e)) from None
        finally:
            self.upload.cleanup()
        canary = "canary" in settings
        newest = dep["versions"][-1] if dep.get("versions") else {}
        await self.audit(
            "deployment.update" if canary else "deployment.create",
            f"{dep['user']}/{dep['name']}",
            user=dep["user"],
            canary=settings.get("canary"),
            version=newest.get("version") if canary else None,
            gpu_milli=dep.get("gpu_milli"),
            replicas=dep.get("min_replicas"),
            **audit_summary(newest.get("lineage") or {}),
        )
        self.write_json(dep, status=201)


class PromoteHandler(_DeploymentHandler):
    """``POST .../promote``."""

    action = "promote"
    audit_actions = {"POST": "deployment.promote"}

    async def post(self, name):
        dep = self.find(name)
        try:
            if self.action == "promote":
                view = self.deployments.view(await self.deployments.versions.promote(dep))
            else:
                who = self.identity
                by = "its owner" if who.name == dep["user"] else f"{who.kind} {who.name}"
                view = self.deployments.view(
                    await self.deployments.versions.rollback(dep, f"rolled back by {by}")
                )
        except DeployRefused as e:
            raise web.HTTPError(e.status, str(e)) from None
        await self.audit(f"deployment.{self.action}", f"{dep['user']}/{name}", user=dep["user"])
        self.write_json(view)


class RollbackHandler(PromoteHandler):
    """``POST .../rollback``."""

    action = "rollback"
    audit_actions = {"POST": "deployment.rollback"}


class ModelsHandler(_DeploymentHandler):
    """The catalog: every endpoint the caller may call, theirs and those shared with them
    (``"kind": "endpoint"``), and beside them the vector collections they may use
    (``"kind": "collection"``)."""

    async def get(self):
        who = self.require_identity()
        manager = self.deployments
        out = []
        for dep in manager.store.list():
            if not manager.calls.can_use(who, dep):
                continue
            view = manager.view(dep)
            model = view["model"] or {}
            out.append(
                {
                    "kind": "endpoint",
                    "owner": dep["user"],
                    "name": dep["name"],
                    "endpoint": f"{dep['user']}/{dep['name']}",
                    "path": view["path"],
                    "state": view["state"],
                    "shared": dep["user"] != who.name,
                    "inputs": model.get("inputs"),
                    "outputs": model.get("outputs"),
                    "versions": [
                        {"version": v["version"], "weight": v["weight"], "state": v["state"]}
                        for v in view["versions"]
                    ],
                }
            )
        collections = self.gpulab.vectors
        for row in await collections.visible(who) if collections is not None else []:
            view = collections.view(row)
            out.append(
                {
                    "kind": "collection",
                    "owner": view["owner"],
                    "name": view["name"],
                    "collection": view["collection"],
                    "shared": view["owner"] != who.name,
                    "dim": view["dim"],
                    "metric": view["metric"],
                    "embed": view["embed"],
                }
            )
        self.write_json(out)


class ModelLineageHandler(_DeploymentHandler):
    """Where each version of an endpoint came from; to whoever may call it (others
    are refused as a call would be: 404 for the caller's own that does not exist, else
    403, never saying whether a stranger's exists)."""

    def get(self, owner, name):
        manager = self.deployments
        try:
            dep = manager.calls.callable_endpoint(self.require_identity(), owner, name)
        except CallRefused as e:
            raise web.HTTPError(e.status, str(e)) from None
        self.write_json(model_lineage(dep, manager.store.versions(dep["id"])))


class DeploymentHandler(_DeploymentHandler):
    audit_actions = {"PATCH": "deployment.update", "DELETE": "deployment.delete"}

    def get(self, name):
        self.write_json(self.deployments.view(self.find(name)))

    async def patch(self, name):
        dep = self.find(name)
        body = self.json_body()
        try:
            view = self.deployments.share(dep, body)
        except DeployRefused as e:
            raise web.HTTPError(e.status, str(e)) from None
        shared = {"share_users", "share_groups"} & set(body)
        await self.audit(
            "deployment.share" if shared else "deployment.update",
            f"{dep['user']}/{name}",
            user=dep["user"],
            **{
                k: body[k] for k in ("share_users", "share_groups", "stop_with_server") if k in body
            },
        )
        self.write_json(view)

    async def delete(self, name):
        dep = self.find(name)
        who = self.identity
        by = "its owner" if who.name == dep["user"] else f"{who.kind} {who.name}"
        view = await self.deployments.stop_deployment(dep, f"stopped by {by}")
        await self.audit("deployment.delete", f"{dep['user']}/{name}", user=dep["user"])
        self.write_json(view)


class DeploymentLogsHandler(_DeploymentHandler):
    def set_default_headers(self):
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    async def get(self, name):
        dep = self.find(name)
        replica = int_arg("replica", self.get_argument("replica", None), 0, 0)
        version = int_arg("version", self.get_argument("version", None), None, 0)
        try:
            vrow = self.deployments.find_version(dep, version)
        except DeployRefused as e:
            raise web.HTTPError(e.status, str(e)) from None
        most = max(vrow["replicas"], dep["max_replicas"])
        if not 0 <= replica < most:
            raise web.HTTPError(400, f"replica must be from 0 to {most - 1}")
        self.finish(await self.deployments.logs(dep, vrow, replica))


class EndpointHandler(_DeploymentHandler):
    """The authenticated front of a deployment: forwards OIP v2 calls to a replica.

    The call's body (from before it is read) and the replica's answer (until it is
    written) count against the caller's bytes of endpoint calls in memory, the same
    count the endpoint router keeps (:mod:`gpulab.service.endpoints.call_bytes`): past
    it, a 429 with Retry-After."""

    SUPPORTED_METHODS = ("GET", "POST", "HEAD")
    _held = None
    _retry_after: int | None = None

    @property
    def body_setting(self) -> str:
        # The setting is the fix only while it holds the limit below what a model
        # server takes; past that, fewer rows are.
        return "max_upload_mib" if self.gpulab.max_upload_mib < MAX_CALL_MIB else ""

    def body_limit(self) -> int:
        return call_limit(self.gpulab.max_upload_mib)

    def changes_state(self) -> bool:
        return False  # a call (POST .../infer) reads: its token may be a cached answer

    def set_default_headers(self):
        self.set_header("Cache-Control", "no-store")

    # -- the call's bytes in memory: the endpoint calls' count, not the REST routes' --
    def hold_body_room(self, caller: str) -> None:
        if self._refusal is not None or self.gpulab.deployments is None:
            return
        self._held = self.deployments.calls.hold(self.identity)
        length = self.request.headers.get("Content-Length")
        if self.request.method == "POST" and length is not None:
            self._hold(int(length))  # refused before a byte of it is read

    def _hold(self, n: int) -> None:
        try:
            self._held.add(n)
        except NoRoom as e:
            self._retry_after = e.retry_after
            self.refuse_after_body(web.HTTPError(e.status, str(e)))

    def release_body_room(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.release()

    def data_received(self, chunk: bytes) -> None:
        if (
            self._held is not None
            and self._refusal is None
            and "Content-Length" not in self.request.headers
        ):
            self._hold(len(chunk))  # a chunked body: counted as it comes
        super().data_received(chunk)

    def write_error(self, status_code: int, **kwargs) -> None:
        if self._retry_after is not None:  # send_error cleared the headers set before
            self.set_header("Retry-After", str(self._retry_after))
        super().write_error(status_code, **kwargs)

    def _target(self, user: str, name: str) -> dict:
        try:
            return self.deployments.calls.callable_endpoint(self.require_identity(), user, name)
        except CallRefused as e:
            raise web.HTTPError(e.status, str(e)) from None

    async def get(self, user, name, path):
        await self._forward(user, name, path)

    async def head(self, user, name, path):
        await self._forward(user, name, path)

    async def post(self, user, name, path):
        await self._forward(user, name, path)

    async def _forward(self, user: str, name: str, path: str) -> None:
        dep = self._target(user, name)
        who = self.require_identity()
        query = f"?{self.request.query}" if self.request.query else ""
        body = self.raw_body() if self.request.method == "POST" else None
        self._chunks.clear()  # joined into ``body``: not held twice
        if self._held is None:
            self._held = self.deployments.calls.hold(who)
        # Kept here: a caller that goes away releases self._held (on_connection_close)
        # while the replica still works; its answer is then counted nowhere.
        held = self._held
        try:
            answer = await self.deployments.calls.call(
                dep,
                self.request.method,
                path + query,
                forwarded_headers(self.request.headers),
                body,
                who=who,
                held=held,
            )
        except (CallRefused, NoRoom) as e:
            self._retry_after = e.retry_after
            raise web.HTTPError(e.status, str(e)) from None
        status, reason, resp_headers, resp_body = answer
        if body is not None:  # answered: only the answer is held while it is written
            held.drop(len(body))
            del body
        self.set_status(status, reason)
        for h, value in answer_headers(resp_headers).items():
            self.set_header(h, value)
        await self._write_answer(status, resp_body)

    async def _write_answer(self, status: int, data) -> None:
        """``data`` a slice at a time, each flushed within WRITE_TIMEOUT_S (a caller that
        reads nothing is hung up on): never a second whole copy of a large answer."""
        if self.request.method == "HEAD" or status in (204, 304) or not data:
            self.finish(bytes(data) if self.request.method != "HEAD" else None)
            return
        self.set_header("Content-Length", str(len(data)))
        view = memoryview(data)
        try:
            for at in range(0, len(view), WRITE_SLICE):
                self.write(bytes(view[at : at + WRITE_SLICE]))
                await asyncio.wait_for(self.flush(), WRITE_TIMEOUT_S)
        except TimeoutError:
            self.request.connection.close()  # a caller that does not read: gone
            return
        except StreamClosedError:
            return  # the caller went away
        self.finish()


routes = [
    (r"api/v1/deployments", DeploymentsHandler),
    (r"api/v1/deployments/([^/]+)", DeploymentHandler),
    (r"api/v1/deployments/([^/]+)/logs", DeploymentLogsHandler),
    (r"api/v1/deployments/([^/]+)/promote", PromoteHandler),
    (r"api/v1/deployments/([^/]+)/rollback", RollbackHandler),
    (r"api/v1/models", ModelsHandler),
    (r"api/v1/models/([^/]+)/([^/]+)/lineage", ModelLineageHandler),
    (r"endpoints/([^/]+)/([^/]+)/(.*)", EndpointHandler),
]
