"""Vector collections: who may do what, the rows checked, the engine called.

The rules are the endpoints': the owner and admins manage a collection (share,
drop); they and the users and groups it is shared with list, search, insert, upsert
and delete rows; to anyone else it does not exist. A collection that names an
embedding endpoint (``embed="alice/minilm"``) takes texts: they are embedded through
that endpoint as the caller (who must be allowed to call it), in batches.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from gpulab.db.collections import CollectionNameTaken, CollectionStore
from gpulab.db.engine import utcnow
from gpulab.service.endpoints.settings import DeployRefused, check_sharing

from . import checks, row_cost
from .checks import CollectionLimits, Refused
from .embedded import EmbeddedEngine
from .engine import EngineError, IdsTaken, VectorEngine, database_of
from .engine_process import EngineProcess

log = logging.getLogger("gpulab.service.vectors")

SHARING = ("share_users", "share_groups")
#: Texts per call to the embedding endpoint (its batcher splits further).
EMBED_BATCH = 256
#: Batches of texts sent to the embedding endpoint at once, per request.
EMBED_CONCURRENCY = 4
#: A collection is flushed once this many rows were written, or once writes to it
#: paused this long: a Milvus cluster seals its new rows into indexed segments (it
#: searches rows not sealed yet one by one); the embedded engine folds a long log into
#: a snapshot, so a restart replays little.
FLUSH_ROWS = 20_000
SEAL_IDLE_S = 2.0
#: How old the count of an owner's rows may be before a write counts them again in
#: the engine (between counts, this manager adds what it writes and deletes).
ROWS_RECOUNT_S = 60.0
#: After a call ran past its limit, how long the embedded engine has to answer a ping
#: before it is taken as stuck in that call and restarted.
PING_S = 5.0
#: (caller, owner, endpoint name, texts) -> one vector per text.
Embedder = Callable[[object, str, str, list[str]], Awaitable[list[list[float]]]]


def can_use(who, row: dict) -> bool:
    return (
        who.can_act_for(row["user"])
        or who.name in row["share_users"]
        or bool(who.groups & set(row["share_groups"]))
    )


class CollectionManager:
    def __init__(
        self,
        store: CollectionStore,
        engine: VectorEngine | EmbeddedEngine,
        limits: CollectionLimits,
        embedder: Embedder | None,
        endpoint_lineage: Callable[[str, str], dict | None],
        process: EngineProcess | None = None,
        endpoint_row: Callable[[str, str], dict | None] = lambda owner, name: None,
    ):
        self.store = store
        #: (owner, name) -> the endpoint's row (who it is shared with), or None.
        self.endpoint_row = endpoint_row
        self.engine = engine
        self.limits = limits
        self.embedder = embedder
        self.endpoint_lineage = endpoint_lineage
        self.process = process
        self._started = asyncio.Lock()
        self._up = False
        self._unsealed: dict[str, int] = {}
        self._last_write: dict[str, float] = {}
        #: (owner, name) -> its row: every call looks one up, and only this manager
        #: changes rows (sharing, drop), so a query per call (1.5 ms) is not needed.
        self._rows: dict[tuple[str, str], dict] = {}
        #: (owner, name) -> how often its row was changed (shared, dropped) here. A row
        #: read in a thread is cached only if no change began or ended while it was
        #: read: one read before a change must not outlive it (bob kept using a
        #: collection alice had stopped sharing with him; a dropped one hid a new one).
        self._changes: collections.Counter[tuple[str, str]] = collections.Counter()
        self._tasks: set[asyncio.Task] = set()
        self._probing = False
        #: owner -> (when counted, rows their collections hold, what those cost the
        #: engine's memory: row_cost; None where the engine does not say): counted in
        #: the engine at most every ROWS_RECOUNT_S, kept up to date by this manager's
        #: writes.
        self._held: dict[str, tuple[float, int, int | None]] = {}
        #: owner -> rows, and their bytes, of writes under way (room held for them:
        #: calls at once each passed the check on the count before the others' were in).
        self._writing: collections.Counter[str] = collections.Counter()
        self._writing_bytes: collections.Counter[str] = collections.Counter()
        #: owner -> one check of the room at a time (a recount is awaited).
        self._room_locks: collections.defaultdict[str, asyncio.Lock] = collections.defaultdict(
            asyncio.Lock
        )

    @classmethod
    def of(cls, service) -> CollectionManager:
        process = None
        if service.vector_settings.vector_engine_uri:  # a Milvus cluster, through pymilvus
            engine = VectorEngine(
                service.vector_settings.vector_engine_uri,
                service.vector_settings.vector_engine_token,
                call_timeout=service.vector_settings.vector_call_timeout,
            )
        else:  # the embedded engine, a process of the service's
            process = EngineProcess(service.data_dir)
            process.prepare()
            engine = EmbeddedEngine(
                process.uri,
                call_timeout=service.vector_settings.vector_call_timeout,
                search_ef=service.vector_settings.collection_search_ef,
            )
        deployments = service.deployments
        return cls(
            store=CollectionStore(service.engine),
            engine=engine,
            limits=CollectionLimits(
                max_rows=service.vector_settings.collection_max_rows,
                max_dim=service.vector_settings.collection_max_dim,
                max_per_user=service.vector_settings.max_user_collections,
                max_queries=service.vector_settings.collection_max_queries,
                max_hits=service.vector_settings.collection_max_hits,
                max_rows_per_user=service.vector_settings.max_rows_per_user,
                max_bytes_per_user=service.vector_settings.max_mib_per_user << 20,
            ),
            embedder=deployments.calls.embed if deployments is not None else None,
            endpoint_lineage=lambda owner, name: _endpoint_lineage(deployments, owner, name),
            process=process,
            endpoint_row=lambda owner, name: (
                deployments.store.find(owner, name) if deployments is not None else None
            ),
        )

    # -- the engine's process ------------------------------------------------------------
    async def start(self) -> None:
        """Start the embedded engine now if collections exist (it replays its log);
        else at the first call, so a site without collections never runs it."""
        if self.process is not None and self.store.list():
            self._spawn(self.ready())

    async def ready(self) -> None:
        """Until the embedded engine answers (its first start: it replays its logs, and
        copies an older engine's collections); calls meanwhile wait, not fail."""
        if self.process is None or self._up:
            return
        async with self._started:
            if self._up:
                return
            try:
                await self.process.start()
            except Exception as e:
                log.error("The vector engine did not start: %s", e)
                self.process.proc = None
                raise Refused(503, f"the vector engine did not start: {e}") from None
            await self._sweep()
            self._up = True

    async def _sweep(self) -> None:
        """Say which of the engine's collections no row names: a drop removes the row
        first, so one whose engine call failed (the engine down, the service stopped
        between) left its vectors on disk, uncounted. They are named, not removed: a
        database restored from a backup, or another site's, names fewer collections
        than the engine holds, and removing those would lose them."""
        try:
            rows = await asyncio.to_thread(self.store.list)
            held = await self.engine.held()
        except Exception as e:
            log.warning("Could not look for dropped collections left in the vector engine: %s", e)
            return
        named = {(database_of(row["user"]), row["id"]) for row in rows}
        left = sorted(f"{db}/{cid}" for db, cid in held if (db, cid) not in named)
        if left:
            log.warning(
                "The vector engine holds %d collections no row names (a drop that did not "
                "finish, or a database that is not this engine's): %s. Remove their "
                "folders under the engine's data dir once you know they are not wanted",
                len(left),
                ", ".join(left[:50]) + (" ..." if len(left) > 50 else ""),
            )

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.process is not None:
            await self.process.stop()
        self.engine.close()

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _engine(self, call, *args, **kwargs):
        await self.ready()
        try:
            return await call(*args, **kwargs)
        except IdsTaken:  # the caller names the collection
            raise
        except EngineError as e:
            if self.process is not None and not self.process.running:
                raise Refused(503, "the vector engine is restarting; try again") from None
            if e.status == 504:
                self._spawn(self._restart_if_stuck())
            raise Refused(e.status, str(e)) from None

    async def _restart_if_stuck(self) -> None:
        """A call ran past its limit: if the embedded engine answers nothing now, that
        call holds it (a search's filter evaluated row by row holds its interpreter), so
        everyone waits until it ends. Kill it: the watcher starts it again, and it
        replays its log, so no acknowledged row is lost. A busy engine that still
        answers is left to finish."""
        if self.process is None or self._probing:
            return
        self._probing = True
        try:
            if await self.engine.ping(PING_S) or not self.process.running:
                return
            log.warning(
                "The vector engine answered nothing for %g s after a call ran past its "
                "limit: restarting it",
                PING_S,
            )
            self.process.kill()
        finally:
            self._probing = False

    # -- finding -------------------------------------------------------------------------
    # The store is read in a thread: every user's call would wait for it on the loop.
    async def visible(self, who) -> list[dict]:
        return [row for row in await asyncio.to_thread(self.store.list) if can_use(who, row)]

    async def find(self, who, owner: str, name: str, manage: bool = False) -> dict:
        """``owner/name`` if ``who`` may use it (``manage``: share or drop it); else 404
        to its owner and admins, 403 to others (a stranger is not told whether it exists)."""
        key = (owner, name)
        row = self._rows.get(key)
        if row is None:
            changes = self._changes[key]
            row = await asyncio.to_thread(self.store.find, owner, name)
            if row is not None and changes == self._changes[key]:
                self._rows[key] = row
        allowed = row is not None and (who.can_act_for(owner) if manage else can_use(who, row))
        if allowed:
            return row
        if row is None and who.can_act_for(owner):
            raise Refused(404, f"no collection {name!r} of {owner}")
        if row is not None and can_use(who, row):
            raise Refused(403, f"only {owner} and admins may change or drop {owner}/{name}")
        raise Refused(
            403,
            f"{who.name} may not use collection {owner}/{name}: "
            f"it does not exist or is not shared with you",
        )

    def view(
        self,
        row: dict,
        count: int | None = None,
        model_shown: bool = False,
        lists_shown: bool = False,
    ) -> dict:
        """``model_shown``: the viewer may call the embedding endpoint, so its model's
        lineage (job, code, datasets, run) is theirs to read, as the endpoint's lineage
        route says it to its callers only; else the lineage names the endpoint alone.
        ``lists_shown``: the viewer manages the collection (its owner, an admin), so
        who else it is shared with is theirs to read; to the others it is shared with,
        ``share_users`` and ``share_groups`` are empty (an endpoint's lists are its
        owner's alone too)."""
        lineage = row["lineage"]
        if not model_shown and "embed" in lineage:
            lineage = {**lineage, "embed": {"endpoint": lineage["embed"].get("endpoint")}}
        return {
            "owner": row["user"],
            "name": row["name"],
            "collection": f"{row['user']}/{row['name']}",
            "dim": row["dim"],
            "metric": row["metric"],
            "index": row["index_type"],
            "embed": row["embed"],
            "share_users": list(row["share_users"]) if lists_shown else [],
            "share_groups": list(row["share_groups"]) if lists_shown else [],
            "created": row["created"],
            "lineage": lineage,
            # Where the index is built and searched: no GPU index in the embedded engine.
            "device": "cpu",
            "count": count,
        }

    async def views(self, who, rows: list[dict]) -> list[dict]:
        """The views of ``rows`` as ``who`` sees them."""
        shown = await asyncio.to_thread(lambda: [self._may_call_embed(who, r) for r in rows])
        return [
            self.view(row, model_shown=s, lists_shown=who.can_act_for(row["user"]))
            for row, s in zip(rows, shown, strict=True)
        ]

    async def counted_view(self, who, row: dict) -> dict:
        """The view with its rows counted; the embedded engine also says how many wait
        for its index (``pending_index_rows``: searchable already, exactly)."""
        stats = await self._engine(self.engine.stats, row["user"], row["id"], who.name)
        shown = await asyncio.to_thread(self._may_call_embed, who, row)
        view = self.view(row, stats.pop("count"), shown, who.can_act_for(row["user"]))
        return {**view, **stats}

    def _may_call_embed(self, who, row: dict) -> bool:
        """Whether ``who`` may call the endpoint that embeds ``row``'s texts (the rules
        of an endpoint call; reads the endpoint's row: in a thread)."""
        if not row["embed"]:
            return True
        ep_owner, ep_name = row["embed"].split("/", 1)
        if who.can_act_for(ep_owner):
            return True
        ep = self.endpoint_row(ep_owner, ep_name)
        return ep is not None and can_use(who, ep)

    # -- making and dropping -------------------------------------------------------------
    async def create(self, who, body: dict) -> dict:
        checks.fields(body, ("name", "dim", "metric", "index", "embed") + SHARING)
        owner = who.name
        name = checks.name(body.get("name"))
        metric = checks.metric(body.get("metric", "cosine"))
        index = body.get("index", "hnsw")
        if index not in ("hnsw", "flat"):
            raise Refused(400, f"unknown index {index!r}; use hnsw or flat")
        try:
            sharing = check_sharing(body)
        except DeployRefused as e:
            raise Refused(e.status, str(e)) from None
        if len(await asyncio.to_thread(self.store.list, owner)) >= self.limits.max_per_user:
            raise Refused(
                403,
                f"{owner} has {self.limits.max_per_user} collections, the most allowed; "
                "drop one first",
            )
        lineage = {"created_by": who.name, "created": utcnow().isoformat()}
        embed = body.get("embed")
        dim = body.get("dim")
        if embed is not None:
            endpoint = self._endpoint(who, embed)
            probe = await self._embed_as(who, endpoint, ["dimension probe"])
            probe = self._checked_embeddings(endpoint, probe, 1)
            if dim is not None and dim != len(probe[0]):
                raise Refused(
                    400,
                    f"endpoint {endpoint} gives {len(probe[0])}-d vectors, not {dim}-d: "
                    "leave dim out or match it",
                )
            dim = len(probe[0])
            lineage["embed"] = {
                "endpoint": endpoint,
                **(self.endpoint_lineage(*endpoint.split("/", 1)) or {}),
            }
            embed = endpoint
        if dim is None:
            raise Refused(400, "dim is missing: give the vectors' dimension, or embed=an endpoint")
        dim = checks.dimension(dim, self.limits)
        cid = "c" + uuid.uuid4().hex
        await self._engine(self.engine.create, owner, cid, dim, metric, index)
        try:
            row = await asyncio.to_thread(
                self.store.add,
                {
                    "id": cid,
                    "user": owner,
                    "name": name,
                    "dim": dim,
                    "metric": metric,
                    "index_type": index,
                    "embed": embed,
                    "lineage": lineage,
                    **sharing,
                },
            )
        except CollectionNameTaken:
            await self._engine(self.engine.drop, owner, cid)
            raise Refused(409, f"{owner} already has a collection {name!r}") from None
        # Its maker just called the endpoint (the dimension probe): may see its model.
        return self.view(row, 0, model_shown=True, lists_shown=True)

    async def drop(self, row: dict) -> None:
        # The row goes first: a crash between the two leaves an engine collection no row
        # names (unreachable; the embedded engine's is named at the next start: _sweep),
        # never a row whose vectors are gone.
        key = (row["user"], row["name"])
        self._changes[key] += 1
        self._rows.pop(key, None)
        self._held.pop(row["user"], None)  # counted again at the next write
        try:
            await asyncio.to_thread(self.store.remove, row["id"])
        finally:
            self._changes[key] += 1  # a read begun before the removal is not cached either
            # A read that began after the first bump and ended before the removal did
            # returned the row and cached it meanwhile: it must not outlive this drop.
            self._rows.pop(key, None)
        await self._engine(self.engine.drop, row["user"], row["id"])

    async def share(self, who, row: dict, body: dict) -> dict:
        checks.fields(body, SHARING)
        try:
            values = check_sharing(body)
        except DeployRefused as e:
            raise Refused(e.status, str(e)) from None

        def save() -> tuple[dict | None, str, bool]:
            if values:
                self.store.update(row["id"], **values)
            saved = self.store.get(row["id"])
            if saved is None:
                return None, "", False
            return saved, self._endpoint_not_shared(saved), self._may_call_embed(who, saved)

        # Nothing read before the change is cached after it: the cached row goes now,
        # reads that straddle the save are not cached (their count moved), and the row
        # as saved is cached once it is in, unless another change came between.
        key = (row["user"], row["name"])
        self._changes[key] += 1
        self._rows.pop(key, None)
        mine = self._changes[key]
        try:
            saved, warning, shown = await asyncio.to_thread(save)
        finally:
            last = self._changes[key] == mine
            self._changes[key] += 1
            self._rows.pop(key, None)
        if saved is None:  # dropped meanwhile
            raise Refused(404, f"no collection {row['name']!r} of {row['user']}")
        row = saved
        if last:
            self._rows[key] = row
        view = self.view(row, model_shown=shown, lists_shown=who.can_act_for(row["user"]))
        if warning:
            view["warning"] = warning
        return view

    def _endpoint_not_shared(self, row: dict) -> str:
        """For a collection of texts: which of those it is shared with may not call the
        endpoint that embeds them, said with the call that shares it too."""
        if not row["embed"]:
            return ""
        ep_owner, ep_name = row["embed"].split("/", 1)
        ep = self.endpoint_row(ep_owner, ep_name)
        if ep is None:
            return ""
        ep_users, ep_groups = set(ep["share_users"]), set(ep["share_groups"])
        users = [u for u in row["share_users"] if u != ep_owner and u not in ep_users]
        groups = [g for g in row["share_groups"] if g not in ep_groups]
        if not users and not groups:
            return ""
        who = ", ".join(users + [f"group {g}" for g in groups])
        if row["user"] == ep_owner:  # the endpoint is theirs: its lists are theirs to see
            fix = ", ".join(
                f"share_{kind}={current + missing!r}"
                for kind, current, missing in (
                    ("users", ep["share_users"], users),
                    ("groups", ep["share_groups"], groups),
                )
                if missing
            )
            how = f'Client().share_deployment("{ep_name}", {fix})'
        else:  # another's endpoint: who else may call it is not the caller's to read
            how = f"ask {ep_owner} to share endpoint {ep_name} with them"
        return (
            f"{row['user']}/{row['name']} embeds texts through endpoint {row['embed']}, "
            f"which {who} may not call: they can search it with vectors, but text searches "
            f"and inserts of texts are refused until the endpoint is shared too: {how}"
        )

    # -- rows ----------------------------------------------------------------------------
    async def write(self, who, row: dict, body: dict, upsert: bool) -> dict:
        checks.fields(body, ("ids", "vectors", "vectors_base64", "texts", "metadata"))
        if "vectors_base64" in body:  # the packed form: no numbers to parse one by one
            if "vectors" in body:
                raise Refused(400, "send vectors or vectors_base64, not both")
            vectors = checks.packed_vectors(body["vectors_base64"], row["dim"], self.limits)
            texts = body.get("texts")
            if texts is not None:
                texts = checks.texts_of_vectors(texts, len(vectors), self.limits)
        elif "vectors" in body and "texts" in body:
            # Vectors the caller embedded, and the texts they came from, kept beside them.
            vectors = checks.vectors(body["vectors"], row["dim"], self.limits)
            texts = checks.texts_of_vectors(body["texts"], len(vectors), self.limits)
        else:
            vectors = await self._vectors_of(who, row, body, "vectors", "texts")
            texts = body.get("texts")
        n = len(vectors)
        ids = checks.ids(body.get("ids"), n)
        metadata = checks.metadata(body.get("metadata"), n)
        if texts is not None:  # a hit returns what it found: the text is kept in the row
            metadata = [{**m, checks.TEXT_KEY: t} for m, t in zip(metadata, texts, strict=True)]
        rows = [
            {"id": i, "vector": v, "metadata": m}
            for i, v, m in zip(ids, vectors, metadata, strict=True)
        ]
        owner = row["user"]
        if n <= 32:
            cost = row_cost.rows_cost(row["dim"], metadata)
        else:  # a pass over every row's metadata: off the service's loop
            cost = await asyncio.to_thread(row_cost.rows_cost, row["dim"], metadata)
        await self._room_for(who, owner, n, cost)  # held in _writing until the write ends
        try:
            # An insert's ids are looked for by the engine in the step that writes them
            # (two inserts of one id at once: one is refused, not both written).
            await self._engine(
                self.engine.write,
                owner,
                row["id"],
                rows,
                upsert,
                caller=who.name,
                new_ids=body.get("ids") is None,
            )
        except IdsTaken as e:
            raise Refused(
                409,
                f"{e.n} of these ids are in {owner}/{row['name']} already "
                f"({', '.join(e.ids)}); use upsert to replace them",
            ) from None
        finally:
            self._writing[owner] -= n
            self._writing_bytes[owner] -= cost
        self._add_held(owner, n, cost)  # an upsert that replaced rows: recounted later
        self._written(row, n)
        return {"ids": ids, "count": n}

    async def _room_for(self, who, owner: str, n: int, cost: int) -> None:
        """403 if ``n`` more rows, costing ``cost`` bytes (:mod:`.row_cost`), would pass
        what ``owner``'s collections may hold; else the room is held for them
        (``_writing``) until the caller's write ends."""
        most = self.limits.max_rows_per_user
        budget = self.limits.max_bytes_per_user
        async with self._room_locks[owner]:
            counted = self._held.get(owner)
            if counted is None or time.monotonic() - counted[0] > ROWS_RECOUNT_S:
                mine = await asyncio.to_thread(self.store.list, owner)
                held, held_bytes = 0, 0
                for r in mine:
                    rows, size = await self._engine(
                        self.engine.usage, owner, r["id"], caller=who.name
                    )
                    held += rows
                    held_bytes = None if size is None or held_bytes is None else held_bytes + size
                self._held[owner] = counted = (time.monotonic(), held, held_bytes)
            held = counted[1] + self._writing[owner]
            if held + n > most:
                raise Refused(
                    403,
                    f"{owner}'s collections hold {held:,} rows; {n:,} more would pass "
                    f"the {most:,} one user's collections may hold: delete rows or drop a "
                    f"collection (an admin can raise c.VectorSettings.max_rows_per_user)",
                )
            if counted[2] is not None:  # the engine's memory is the host's: budgeted
                size = counted[2] + self._writing_bytes[owner]
                if size + cost > budget:
                    raise Refused(
                        403,
                        f"{owner}'s collections take {_mib(size)} of the vector engine's "
                        f"memory (vectors, and metadata counted as JSON plus "
                        f"{row_cost.PER_ITEM} bytes a key or list item); these {n:,} rows "
                        f"({_mib(cost)}) would pass the {_mib(budget)} one user's "
                        "collections may take: delete rows, drop a collection, or keep "
                        "less metadata per row (an admin can raise "
                        "c.VectorSettings.max_mib_per_user)",
                    )
            self._writing[owner] += n
            self._writing_bytes[owner] += cost

    def _add_held(self, owner: str, n: int, cost: int = 0) -> None:
        if owner in self._held:
            when, held, size = self._held[owner]
            size = None if size is None else max(0, size + cost)
            self._held[owner] = (when, max(0, held + n), size)

    async def delete(self, who, row: dict, body: dict) -> dict:
        if set(body) != {"ids"}:
            raise Refused(400, 'send {"ids": [...]}: the ids of the rows to delete')
        ids = body["ids"]
        if not isinstance(ids, list):
            raise Refused(400, "ids must be a list")
        checks.rows_count(len(ids), self.limits, "ids")
        ids = checks.ids(ids, len(ids))
        owner = row["user"]
        found = await self._engine(self.engine.existing, owner, row["id"], ids, who.name)
        if found:
            await self._engine(self.engine.delete, owner, row["id"], sorted(found), who.name)
            # The bytes the rows took are the engine's to say: counted again next write.
            self._held.pop(owner, None)
        return {"deleted": len(found)}

    async def search(self, who, row: dict, body: dict) -> dict:
        checks.fields(body, ("vector", "vectors", "text", "texts", "k", "filter"))
        many = "vectors" in body or "texts" in body
        one = {"vector": "vectors", "text": "texts"}
        query = {
            one.get(key, key): [v] if key in one else v
            for key, v in body.items()
            if key in ("vector", "vectors", "text", "texts")
        }
        # What is cheap to check first: a search too big, a filter refused, before texts
        # are embedded or the engine is called.
        k = checks.k(body.get("k", 10))
        given = query.get("vectors", query.get("texts"))
        if isinstance(given, list):
            checks.search_size(len(given), k, self.limits)
        expression = checks.filter_expression(body.get("filter"), self.engine.filter_text)
        vectors = await self._vectors_of(who, row, query, "vectors", "texts")
        found = await self._engine(
            self.engine.search,
            row["user"],
            row["id"],
            vectors,
            k,
            row["metric"],
            expression,
            caller=who.name,
        )
        found = [[_with_text(hit) for hit in hits] for hits in found]
        return {"results": found} if many else {"hits": found[0]}

    # -- embedding -----------------------------------------------------------------------
    async def _vectors_of(self, who, row: dict, body: dict, vkey: str, tkey: str) -> list:
        given = [key for key in (vkey, tkey) if key in body]
        if len(given) != 1:
            raise Refused(400, f"send either {vkey} or {tkey}")
        if vkey in body:
            return checks.vectors(body[vkey], row["dim"], self.limits, vkey)
        texts = checks.texts(body[tkey], self.limits)
        if not row["embed"]:
            raise Refused(
                400,
                f"{row['user']}/{row['name']} names no embedding endpoint: send vectors, "
                'or make the collection with embed="owner/endpoint"',
            )
        vectors = []
        # The batches in flight together (a few): the endpoint's batcher runs them as
        # its model's batches allow (on the GPU where the endpoint holds one).
        slots = asyncio.Semaphore(EMBED_CONCURRENCY)

        async def embedded(batch: list[str]) -> list[list[float]]:
            async with slots:
                return await self._embed_as(who, row["embed"], batch)

        try:
            for part in await asyncio.gather(
                *(
                    embedded(texts[start : start + EMBED_BATCH])
                    for start in range(0, len(texts), EMBED_BATCH)
                )
            ):
                vectors += part
        except Refused as e:
            ep_owner, ep_name = row["embed"].split("/", 1)
            if e.status != 403 or who.can_act_for(ep_owner):
                raise
            raise Refused(
                403,
                f"{who.name} may use {row['user']}/{row['name']} but not call the endpoint "
                f"that embeds its texts, {row['embed']}: ask {ep_owner} to share it with you "
                f'too (Client().share_deployment("{ep_name}", share_users=[..., '
                f'"{who.name}"])), or send vectors you embed yourself',
            ) from None
        if any(isinstance(v, list) and len(v) != row["dim"] for v in vectors):
            raise Refused(
                502,
                f"endpoint {row['embed']} gave vectors of another size than the "
                f"collection's {row['dim']}; was it redeployed with another model?",
            )
        return self._checked_embeddings(row["embed"], vectors, len(texts), row["dim"])

    def _checked_embeddings(self, endpoint: str, vectors, n: int, dim: int | None = None):
        """The endpoint's answer as the checks of a user's vectors take it (one list of
        ``dim`` finite numbers within float32's range per text): the model server is
        the user's, and a NaN it gave (JSON's parser takes ``NaN``) would go into the
        index that everyone's searches use. Else a 502 naming the endpoint."""
        if not isinstance(vectors, list) or len(vectors) != n:
            got = f"{len(vectors)} vectors" if isinstance(vectors, list) else "no list"
            raise Refused(502, f"endpoint {endpoint} gave {got} for {n} texts")
        if dim is None:  # the dimension probe: the endpoint's own size is the collection's
            dim = len(vectors[0]) if isinstance(vectors[0], list) else 0
        try:
            return checks.vectors(vectors, dim, self.limits, "embeddings")
        except Refused as e:
            raise Refused(
                502,
                f"endpoint {endpoint} gave embeddings the collection cannot keep: {e}; "
                "is its model server sound (a model giving NaN or inf)?",
            ) from None

    def _endpoint(self, who, embed) -> str:
        if not isinstance(embed, str) or not embed.strip():
            raise Refused(400, 'embed must name an endpoint: "minilm" or "alice/minilm"')
        owner, _, name = embed.rpartition("/")
        return f"{owner or who.name}/{name}"

    async def _embed_as(self, who, endpoint: str, texts: list[str]) -> list[list[float]]:
        if self.embedder is None:
            raise Refused(503, "no deployment manager here to embed texts; send vectors")
        owner, name = endpoint.split("/", 1)
        try:
            return await self.embedder(who, owner, name, texts)
        except Refused:
            raise
        except Exception as e:
            status = getattr(e, "status", None)
            if isinstance(status, int):
                raise Refused(status, f"embedding through {endpoint}: {e}") from None
            raise

    def _written(self, row: dict, n: int) -> None:
        cid = row["id"]
        self._last_write[cid] = time.monotonic()
        waiting = cid in self._unsealed
        self._unsealed[cid] = self._unsealed.get(cid, 0) + n
        if self._unsealed[cid] >= FLUSH_ROWS:
            self._unsealed[cid] = 0
            self._spawn(self._seal(row))
        elif not waiting:
            self._spawn(self._seal_when_idle(row))

    async def _seal_when_idle(self, row: dict) -> None:
        cid = row["id"]
        while (idle := time.monotonic() - self._last_write[cid]) < SEAL_IDLE_S:
            await asyncio.sleep(SEAL_IDLE_S - idle)
        self._unsealed.pop(cid, None)
        await self._seal(row)

    async def _seal(self, row: dict) -> None:
        if await asyncio.to_thread(self.store.get, row["id"]) is None:  # dropped meanwhile
            return
        try:
            await self.engine.flush(row["user"], row["id"])
        except Exception as e:  # a later write seals it again
            log.warning("Sealing %s/%s failed: %s", row["user"], row["name"], e)


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def _with_text(hit: dict) -> dict:
    """The hit with the text its row keeps as ``text`` (None for a row of vectors alone)."""
    metadata, text = hit["metadata"], None
    if checks.TEXT_KEY in metadata:  # copied only then: most hits of a search keep none
        metadata = dict(metadata)
        text = metadata.pop(checks.TEXT_KEY)
    return {**hit, "metadata": metadata, "text": text}


def _endpoint_lineage(deployments, owner: str, name: str) -> dict | None:
    """The endpoint's newest version and where it came from, when it is known."""
    if deployments is None:
        return None
    dep = deployments.store.find(owner, name)
    if dep is None:
        return None
    versions = deployments.store.versions(dep["id"])
    if not versions:
        return None
    newest = versions[-1]
    return {"version": newest["version"], "model": newest.get("lineage") or None}
