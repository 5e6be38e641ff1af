"""One call to an endpoint, from an authorised caller to a replica: the hot path.

Both front doors use it (the endpoint router of :mod:`gpulab.service.endpoints.router` and the
service's own route), over the endpoints in memory (:class:`LiveCalls`); the standby
router runs the same path over the last endpoint table
(:class:`~gpulab.service.endpoints.standby.TableCalls`). It

1. takes only the Open Inference Protocol v2 routes (``v2/...``, :func:`replica_path`):
   a language model's OpenAI routes (``v1/...``) are the gateway's, which meters tokens;
2. picks the version: the one the URL names (``/v2/models/M/versions/N/...``,
   which reaches version N whatever its weight), else by weight;
3. picks the version's least busy ready replica; where none runs (scaled to
   zero) the call waits for a cold start, up to ``endpoint_cold_start_seconds``;
4. forwards the call with the replicas' own secret and counts it
   (:class:`~gpulab.service.endpoints.traffic.UnitTraffic`) for the autoscaler and the listing.

A refusal tells the state message of a version (which can hold its replicas' log)
only to the endpoint's owner and admins (:meth:`CallRefused.told_to`).

:meth:`EndpointCalls.embed` takes the same path for the service's own callers
(vector collections): texts in, embeddings out, on behalf of a user.

Everything here runs per call, on the service's event loop: no database, no
lock, no await but the wait for a replica and the forward itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time

from yarl import URL

from gpulab.backend.serving_base import ServingBackend
from gpulab.service.endpoints.call_bytes import CallBytes, Held, NoRoom
from gpulab.service.endpoints.live import LiveEndpoints, serving_unit
from gpulab.service.endpoints.proxy import (
    MAX_ANSWER_BYTES,
    AnswerTooLarge,
    EndpointProxy,
    off_loop_if_large,
)
from gpulab.service.endpoints.settings import EndpointLimits
from gpulab.service.endpoints.table import DEPLOYMENT_FIELDS, VERSION_FIELDS

#: The card kind of an embedding endpoint (gpulab.serving.embedding.KIND; the service
#: does not import serving/).
EMBEDDING_KIND = "sentence-embedding"

#: The largest call body a replica takes (``gpulab.serving.server``'s
#: ``DEFAULT_MAX_BODY_MIB``, which replicas run with): a larger one is refused before it
#: is held in the service's memory (``c.GpuLabService.max_upload_mib``, up to GiBs, is
#: for model uploads).
MAX_CALL_MIB = 256

#: ``v2/models/<name>/versions/<n>/<rest>``: the version the caller asks for.
VERSIONED = re.compile(r"^(v2/models/[^/]+)/versions/([^/]+)(/.*)?$")

#: What a caller other than the endpoint's owner reads in place of the state message of
#: its versions, which can hold their replicas' log (the owner's code and data).
ASK_THE_OWNER = "its owner sees why in %deploy --list"


class CallRefused(Exception):
    """A call that reaches no replica: the HTTP status, a message, maybe Retry-After;
    ``owner_message``, where set, is the message its owner and admins read instead."""

    def __init__(
        self,
        status: int,
        message: str,
        retry_after: int | None = None,
        owner_message: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.owner_message = owner_message

    def told_to(self, who, dep: dict) -> CallRefused:
        """This refusal as ``who`` (None: anyone) may read it about endpoint ``dep``."""
        if self.owner_message is None or who is None or not who.can_act_for(dep["user"]):
            return self
        return CallRefused(self.status, self.owner_message, self.retry_after)


def _why_refused(status: int, say, why: str, retry_after: int | None = None) -> CallRefused:
    """``say(reason)`` with the version's state message ``why`` for its owner and
    :data:`ASK_THE_OWNER` for everyone else."""
    return CallRefused(status, say(ASK_THE_OWNER), retry_after, owner_message=say(why))


def replica_path(dep: dict, path: str) -> str:
    """``path`` (after ``endpoints/<owner>/<name>/``, with its query) as the replica will
    read it; CallRefused 404 unless it is an Open Inference Protocol v2 route.

    A language model's replica also serves OpenAI's routes under ``v1/``: they are the
    gateway's to call, which meters the tokens. The path is judged as sent, after the
    client library resolves ``..`` and decodes ``%76`` ("v2/../v1" is "v1")."""
    url = URL(f"http://replica/{path}")
    sent = url.raw_path.lstrip("/")
    if sent != "v2" and not sent.startswith("v2/"):
        endpoint = f"{dep['user']}/{dep['name']}"
        if sent == "v1" or sent.startswith("v1/"):
            raise CallRefused(
                404,
                f"the endpoint URL serves Open Inference Protocol v2 (.../v2/...), not {sent}; "
                "call a language or embedding model's OpenAI routes through the gateway, "
                f'<hub>/services/gpulab/v1, with model "{endpoint}"',
            )
        raise CallRefused(
            404,
            f"no route /{sent} at an endpoint URL: it serves Open Inference Protocol v2, "
            f"<hub>/services/gpulab/endpoints/{endpoint}/v2/...",
        )
    return sent + (f"?{url.raw_query_string}" if url.raw_query_string else "")


class EndpointCalls:
    """The call path over a table of endpoints. A subclass says where the endpoints
    come from (:meth:`endpoint`, :meth:`record`), which replicas of a version are
    ready and their token (:meth:`ready`, :meth:`token`), and what a call does when
    none is (:meth:`cold_start`)."""

    def __init__(self, proxy: EndpointProxy):
        self.proxy = proxy
        #: The bytes of calls (bodies, answers) each caller holds in memory now.
        self.budget = CallBytes()

    # -- what a subclass says ------------------------------------------------------
    def endpoint(self, user: str, name: str) -> dict | None:
        """The deployment an endpoint call names, or None."""
        raise NotImplementedError

    def record(self, dep_id: str):
        """The deployment's versions (``.units``, ``.choice``, ``.by_version()``)."""
        raise NotImplementedError

    def ready(self, dep: dict, unit) -> list[tuple[int, str]]:
        raise NotImplementedError

    def token(self, unit) -> str:
        raise NotImplementedError

    async def cold_start(self, dep: dict, unit) -> list[tuple[int, str]]:
        raise NotImplementedError

    # -- the path --------------------------------------------------------------------
    @staticmethod
    def can_use(who, dep: dict) -> bool:
        """Owner, admins, and those it is shared with (by name or group)."""
        return (
            who.can_act_for(dep["user"])
            or who.name in dep["share_users"]
            or bool(who.groups & set(dep["share_groups"]))
        )

    def callable_endpoint(self, who, user: str, name: str) -> dict:
        """The deployment ``who`` may call as ``user/name``; CallRefused 404 for the
        caller's own that does not exist, else 403 (a stranger is not told which)."""
        dep = self.endpoint(user, name)
        if dep is not None and self.can_use(who, dep):
            return dep
        if dep is None and who.can_act_for(user):
            raise CallRefused(404, f"no deployment {name!r} of {user}")
        raise CallRefused(
            403,
            f"{who.kind} {who.name} may not call endpoint {user}/{name}: "
            f"it does not exist or is not shared with you",
        )

    def _choose(self, dep: dict, path: str):
        """``(unit, path to send)``: the version the path names, or one by weight."""
        rec = self.record(dep["id"])
        m = VERSIONED.match(path)
        if m:
            for unit in rec.units.values():
                if str(unit.row["version"]) == m.group(2):
                    # The replicas each serve one model: the version is ours to route.
                    return unit, m.group(1) + (m.group(3) or "")
            raise CallRefused(
                404,
                f"{dep['user']}/{dep['name']} has no version {m.group(2)}; it has "
                f"{', '.join(str(u.row['version']) for u in rec.by_version())}",
            )
        weights = {vid: u.row["weight"] for vid, u in rec.units.items()}
        chosen = rec.choice.pick(weights)
        if chosen is None:
            endpoint = f"{dep['user']}/{dep['name']}"
            raise CallRefused(
                503,
                f"{endpoint} has no working version; {ASK_THE_OWNER}",
                owner_message=f"{endpoint} has no working version ({dep['message']}); "
                "deploy it again",
            )
        return rec.units[chosen], path

    async def call(
        self,
        dep: dict,
        method: str,
        path: str,
        headers: dict,
        body: bytes | None,
        who=None,
        held: Held | None = None,
    ):
        """Forward one call of ``who`` to an OIP v2 route (:func:`replica_path`):
        ``(status, reason, headers, body)``; CallRefused if no replica answers.
        ``held``: the call's bytes in memory (:meth:`hold`), which its answer joins as
        it is read; :class:`~.call_bytes.NoRoom` (a 429) past the caller's share."""
        try:
            unit, path = self._choose(dep, replica_path(dep, path))
            return await self._forward(dep, unit, method, path, headers, body, held)
        except CallRefused as e:
            raise e.told_to(who, dep) from None

    async def _replicas(self, dep: dict, unit):
        """The ready replicas of ``unit`` to try in turn, ``(replica, url)``: the least
        busy first, each once, those that went away meanwhile left out (cold-started
        if none is ready). CallRefused once none is left."""
        ready = self.ready(dep, unit) or await self.cold_start(dep, unit)
        tried: set[int] = set()
        while ready:
            replica, url = unit.traffic.least_busy(ready)
            tried.add(replica)
            yield replica, url
            # That replica just went away (scaled down, crashed): try another.
            ready = [r for r in self.ready(dep, unit) if r[0] not in tried]
        raise _why_refused(
            503,
            lambda why: (
                f"no replica of {dep['user']}/{dep['name']} version "
                f"{unit.row['version']} is ready ({unit.row['state']}: {why}); try again shortly"
            ),
            unit.row["message"],
            retry_after=2,
        )

    def hold(self, who) -> Held:
        """A new call's bytes in memory, counted against ``who`` (:mod:`.call_bytes`):
        its body as it is read, its answer until it is sent; ``release()`` at its end."""
        return self.budget.hold(f"{who.kind}:{who.name}")

    async def _forward(
        self, dep: dict, unit, method: str, path: str, headers: dict, body, held=None
    ):
        start = time.monotonic()
        async with contextlib.aclosing(self._replicas(dep, unit)) as replicas:
            async for replica, url in replicas:
                unit.traffic.begin(replica)
                answer, ours = None, False
                # An attempt that brings no answer gives back what it counted of it
                # (the next replica's answer is counted afresh).
                before = held.bytes if held is not None else 0
                try:
                    answer = await self.proxy.forward(
                        url, self.token(unit), method, path, headers, body, held
                    )
                except NoRoom:
                    ours = True  # the caller's share, not the replica's fault
                    raise
                finally:
                    error = not ours and (answer is None or answer[0] >= 500)
                    unit.traffic.end(replica, time.monotonic() - start, error)
                    if answer is None and held is not None and held.bytes > before:
                        held.drop(held.bytes - before)
                if answer is not None:
                    return answer
        raise AssertionError("unreachable: _replicas raises when none is left")

    def choose(self, dep: dict, who=None):
        """The version (unit) a call of ``who`` without a version in its path goes to:
        by weight."""
        try:
            return self._choose(dep, "")[0]
        except CallRefused as e:
            raise e.told_to(who, dep) from None

    @contextlib.asynccontextmanager
    async def open(self, dep: dict, unit, method: str, path: str, headers: dict, body, who=None):
        """Forward one call of ``who`` to a ready replica of ``unit`` (any path: the
        gateway's) and hand its answer over open (:meth:`EndpointProxy.open`), to be
        read as it streams; the replica counts as busy until the caller is done with
        it. CallRefused if no replica answers."""
        start = time.monotonic()
        try:
            async with contextlib.aclosing(self._replicas(dep, unit)) as replicas:
                async for replica, url in replicas:
                    unit.traffic.begin(replica)
                    error = True
                    try:
                        async with self.proxy.open(
                            url, self.token(unit), method, path, headers, body
                        ) as resp:
                            if resp is not None:
                                error = resp.status >= 500
                                yield resp
                                return
                    finally:
                        unit.traffic.end(replica, time.monotonic() - start, error)
        except CallRefused as e:
            raise e.told_to(who, dep) from None

    def endpoints(self) -> list[dict]:
        """Every deployment a call could name (the gateway's model list)."""
        raise NotImplementedError

    def card(self, unit) -> dict | None:
        """The model card (model.json) of a version, or None where it is not at hand."""
        return None

    async def embed(self, who, user: str, name: str, texts: list[str]) -> list[list[float]]:
        """Embeddings of ``texts`` from the embedding endpoint ``user/name``, called on
        behalf of ``who`` (an :class:`~gpulab.service.auth.Identity`): one unit-length
        row of floats per text, in order.

        The same rules as a call through the endpoint's URL: ``who`` must be allowed
        to use it (the owner, admins, those it is shared with; :meth:`callable_endpoint`),
        one version is chosen by weight for every text, its least busy ready replica
        gets the calls with the replicas' own secret, and a version scaled to zero is
        started (cold start). The texts go as OIP v2 infer requests (``text``, BYTES),
        as many as the version's ``max_batch_size`` needs (one for up to that many).

        Raises :class:`CallRefused` (status, one-line reason): 404/403 as
        :meth:`callable_endpoint`; 400 for texts that are not a non-empty list of
        strings, or an endpoint that is not an embedding endpoint (a card of kind
        ``sentence-embedding``); 503/429 where no replica answers in time; the
        replica's own status and message where it refuses a request.
        """
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise CallRefused(400, "texts must be a non-empty list of strings")
        dep = self.callable_endpoint(who, user, name)
        unit = self.choose(dep, who)
        card = self.card(unit)
        if not card or card.get("kind") != EMBEDDING_KIND:
            raise CallRefused(
                400,
                f"{dep['user']}/{dep['name']} is not an embedding endpoint; "
                "deploy a SentenceTransformer (%deploy) to embed text",
            )
        return await self.embed_on(dep, unit, texts, who)

    async def embed_on(self, dep: dict, unit, texts: list[str], who=None) -> list[list[float]]:
        """Embeddings of ``texts`` from version ``unit`` of the embedding endpoint
        ``dep`` (its caller ``who`` and kind already checked, as :meth:`embed` does)."""
        try:
            return await self._embed_on(dep, unit, texts)
        except CallRefused as e:
            raise e.told_to(who, dep) from None

    async def _embed_on(self, dep: dict, unit, texts: list[str]) -> list[list[float]]:
        path = f"v2/models/{dep['name']}/infer"
        rows: list[list[float]] = []
        answered = 0  # bytes of the replica's answers, held to one answer's cap together
        # The most rows one request may carry (the standby's table does not say: all).
        step = max(1, int(unit.row.get("max_batch_size") or len(texts)))
        for i in range(0, len(texts), step):
            chunk = texts[i : i + step]
            body = json.dumps(
                {
                    "inputs": [
                        {"name": "text", "datatype": "BYTES", "shape": [len(chunk)], "data": chunk}
                    ]
                }
            ).encode()
            status, _, _, data = await self._forward(
                dep, unit, "POST", path, {"Content-Type": "application/json"}, body
            )
            answered += len(data)
            if answered > MAX_ANSWER_BYTES:
                raise CallRefused(502, str(AnswerTooLarge(MAX_ANSWER_BYTES)))
            rows += await off_loop_if_large(data, _embeddings, dep, status, data, len(chunk))
        return rows


def _embeddings(dep: dict, status: int, data: bytes, n: int) -> list[list[float]]:
    """The rows of a replica's OIP v2 answer; CallRefused with its reason if it refused."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        doc = None
    if status != 200:
        reason = doc.get("error") if isinstance(doc, dict) else None
        raise CallRefused(status, reason or f"{dep['user']}/{dep['name']} answered {status}")
    try:
        (out,) = [o for o in doc["outputs"] if o["name"] == "embedding"]
        flat, (rows, dim) = out["data"], out["shape"]
        if rows != n or len(flat) != rows * dim:
            raise ValueError(f"{rows} rows of {dim} for {n} texts")
    except (TypeError, KeyError, ValueError) as e:
        raise CallRefused(
            502, f"{dep['user']}/{dep['name']} gave no embeddings for {n} texts ({e})"
        ) from None
    return [flat[i * dim : (i + 1) * dim] for i in range(rows)]


class LiveCalls(EndpointCalls):
    """Calls over the endpoints in memory (``live``), to the replicas ``serving`` runs;
    a call to a version with none ready waits for a cold start."""

    def __init__(
        self,
        live: LiveEndpoints,
        serving: ServingBackend,
        limits: EndpointLimits,
        proxy: EndpointProxy,
    ):
        super().__init__(proxy)
        self.live = live
        self.serving = serving
        self.limits = limits
        self._cards: dict[str, dict] = {}  # version id -> its model card

    def endpoint(self, user: str, name: str) -> dict | None:
        dep = self.live.find(user, name)
        if dep is not None and dep["id"] in self.live.stopping_deployments:
            return None  # being stopped: as good as gone
        return dep

    def record(self, dep_id: str):
        return self.live.deps[dep_id]

    def endpoints(self) -> list[dict]:
        return [rec.row for rec in list(self.live.deps.values())]

    def ready(self, dep: dict, unit) -> list[tuple[int, str]]:
        if (
            unit.row["state"] == "failed"
            or unit.row["id"] in self.live.stopping
            or dep["id"] in self.live.stopping_deployments
        ):
            return []  # its replicas are being stopped
        ready = self.serving.ready_replicas(serving_unit(dep, unit.row))
        if unit.draining_from is not None:
            ready = [r for r in ready if r[0] < unit.draining_from]
        return ready

    def token(self, unit) -> str:
        if unit.token is None:
            unit.token = self.serving.token(unit.row["id"])
        return unit.token

    def card(self, unit) -> dict | None:
        vid = unit.row["id"]
        if vid not in self._cards:  # a version's card never changes: read it once
            try:
                with open(os.path.join(self.serving.model_dir(vid), "model.json")) as f:
                    self._cards[vid] = json.load(f)
            except (OSError, ValueError):
                return None
        return self._cards[vid]

    def endpoint_table(self) -> list[dict]:
        """Every endpoint as a call sees it now: the rows' fields a call reads, and
        per version its ready replicas ``[index, address]`` and their token (for the
        standby router, :mod:`gpulab.service.endpoints.table`)."""
        out = []
        for rec in list(self.live.deps.values()):
            dep = rec.row
            versions = []
            for unit in rec.by_version():
                ready = self.ready(dep, unit) if unit.row["state"] != "failed" else []
                token = None
                if ready:
                    try:
                        token = self.token(unit)
                    except OSError:  # its files are being removed: no call goes there
                        ready = []
                versions.append(
                    {
                        **{k: unit.row[k] for k in VERSION_FIELDS},
                        "ready": [list(r) for r in ready],
                        "token": token,
                    }
                )
            out.append({**{k: dep[k] for k in DEPLOYMENT_FIELDS}, "versions": versions})
        return out

    async def cold_start(self, dep: dict, unit) -> list[tuple[int, str]]:
        """Wait for a replica of a version that has none ready (the autoscaler starts
        one when it runs none); its ready replicas, or CallRefused after the wait."""
        limit = self.limits.cold_start_seconds
        if unit.row["id"] in self.live.stopping or dep["id"] in self.live.stopping_deployments:
            raise CallRefused(
                503,
                f"version {unit.row['version']} of {dep['user']}/{dep['name']} is being "
                f"stopped; call the endpoint without a version",
                retry_after=5,
            )
        if unit.row["state"] == "failed":
            raise _why_refused(
                503,
                lambda why: f"version {unit.row['version']} failed: {why}",
                unit.row["message"],
            )
        if unit.traffic.waiting >= unit.row["max_queue"]:
            raise CallRefused(
                429,
                f"{unit.traffic.waiting} calls already wait for "
                f"{dep['user']}/{dep['name']} to start; try again shortly",
                retry_after=5,
            )
        cold = unit.row["replicas"] == 0
        start = time.monotonic()
        unit.traffic.start_wait()
        self.live.wake.set()
        try:
            deadline = start + limit
            while (ready := self.ready(dep, unit)) == [] and time.monotonic() < deadline:
                unit.became_ready.clear()
                with contextlib.suppress(TimeoutError):
                    # The replicas' readiness is probed apart from the loop: looked at
                    # often, so the first one ready takes the call soon.
                    await asyncio.wait_for(
                        unit.became_ready.wait(), min(0.25, deadline - time.monotonic())
                    )
        finally:
            unit.traffic.end_wait()
        if not ready:
            raise _why_refused(
                503,
                lambda why: (
                    f"{dep['user']}/{dep['name']} did not start within {limit:g} s "
                    f"({unit.row['state']}: {why}); try again shortly"
                ),
                unit.row["message"],
                retry_after=5,
            )
        if cold:
            unit.cold_starts += 1
            unit.last_cold_start_s = round(time.monotonic() - start, 3)
        return ready
