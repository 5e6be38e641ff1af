"""FractionalKubeSpawner: a KubeSpawner pod held to a GPU slice.

Use it with ``c.JupyterHub.spawner_class = "gpulab-kube"``. The spawn form
lists the slice sizes with live availability from the gpulab service (an
async ``profile_list``); on start the spawner asks the service for a slice
(``user_options = {"gpu_milli": 250}``, or the form's profile ``gpu-250``),
pins the pod to the node the ledger chose and renders the slice into the pod
through the chosen enforcement backend (:mod:`.kube_enforcement`): resource
limits, annotations, labels, environment, scheduler name, tolerations.

With the ``dra`` backend the slice is a ResourceClaim: the server's own
(``<pod name>-gpu``, created before the pod and deleted when the server stops or
fails to start), or, for a fraction of a card shared through MPS or time-slicing,
that card's shared claim (created once; the cluster frees a claim no pod uses).

Every spawn starts afresh: the slice lives only in ``self._slice_patch``, set
by each ``start`` and applied to the pod object, never in the spawner's
traits; the pod's GPU resources and GPU-granting annotations come from that
patch alone (any set by configuration or hooks are dropped). A start that
fails gives the slice back, and nothing of it reaches the next spawn.
"""

from __future__ import annotations

from kubernetes_asyncio.client.models import (
    CoreV1ResourceClaim,
    V1PodResourceClaim,
    V1ResourceRequirements,
    V1Toleration,
)
from kubespawner import KubeSpawner
from tornado import web
from traitlets import Dict, Unicode, default, validate

from gpulab.enforcement.kube import (
    EnforcementError,
    GpuSlice,
    SlicePatch,
    backend_names,
    check_backend,
    dra,
    pod_slice_patch,
)
from gpulab.enforcement.kube.base import without_gpu_annotations, without_gpu_resources
from gpulab.enforcement.kube.kueue import queue_patch
from gpulab.enforcement.slice_env import strip_enforcement_vars
from gpulab.scheduler.slices import SliceError, label, parse_gpu_milli

from .environments import ENVIRONMENT_ENV, EnvironmentsMixin
from .form import in_fractions, size_title
from .placement import STARTING_LAB, kube_enforcement, placement_of
from .service_traits import GpuLabServiceMixin
from .user_options import parse_user_options

PROFILE_PREFIX = "gpu-"


def profile_slug(milli: int) -> str:
    return f"{PROFILE_PREFIX}{milli}"


def normalize_user_options(options: object) -> object:
    """The form's ``{"profile": "gpu-250"}`` as ``{"gpu_milli": 250}``; others as given."""
    if isinstance(options, dict) and "profile" in options:
        rest = {k: v for k, v in options.items() if k != "profile"}
        slug = str(options["profile"] or "")
        if not slug.startswith(PROFILE_PREFIX):
            raise web.HTTPError(
                400,
                f"invalid user_options: unknown profile {slug!r}; "
                f"profiles are named like {profile_slug(250)!r}",
            )
        return {**rest, "gpu_milli": slug[len(PROFILE_PREFIX) :]}
    return options


#: The environment choice's key for gpulab's own image (no site environment's name
#: starts with a dash).
OWN_IMAGE = "-"


def environment_option(environments: dict[str, dict], title: str) -> dict:
    """KubeSpawner's ``profile_options`` entry for the site's environments (images):
    the pod's image is then the chosen one's (read in ``_start``, not an override)."""
    choices = {OWN_IMAGE: {"display_name": title, "default": True}}
    for name, env in sorted(environments.items()):
        about = env.get("description")
        choices[name] = {"display_name": f"{name} ({about})" if about else name}
    return {"environment": {"display_name": "Environment", "choices": choices}}


def profiles_from_availability(
    availability: dict, inventory: dict | None = None, environments: dict | None = None
) -> list[dict]:
    """KubeSpawner profiles, one per slice size, from the service's availability answer.

    Sizes that cannot be placed now stay listed with the reason (the service
    refuses them if chosen), so a user sees what exists and why it is not free.
    ``environments`` (:func:`environment_option`) is offered with every size.
    """
    sizes = availability.get("sizes") or []
    default = next((s["milli"] for s in sizes if s["available"] and s["milli"]), 0)
    profiles = []
    for s in sizes:
        milli = s["milli"]
        if milli == 0:
            status = "always available"
        elif s["available"]:
            status = f"{s['count']} can be placed now"
        else:
            status = f"unavailable now: {in_fractions(s.get('reason') or 'no capacity')}"
        profiles.append(
            {
                "display_name": size_title(s, inventory),
                "slug": profile_slug(milli),
                "description": status,
                "default": milli == default,
                **({"profile_options": environments} if environments else {}),
            }
        )
    return profiles


def slice_from_allocations(allocations: list[dict], inventory: dict) -> GpuSlice:
    """The ledger's rows for one owner, with the cards' model and memory from the inventory."""
    if not allocations:
        return GpuSlice(0)
    cards = {g["uuid"]: g for n in inventory.get("nodes", []) for g in n.get("gpus", [])}
    first = cards.get(allocations[0]["gpu_uuid"], {})
    return GpuSlice(
        milli=sum(a["milli"] for a in allocations),
        memory_mib=allocations[0]["memory_mib"],
        card_memory_mib=int(first.get("memory_mib") or 0),
        gpu_model=str(first.get("model") or ""),
        node=allocations[0]["node"],
        gpu_uuids=tuple(a["gpu_uuid"] for a in allocations),
        simulated=any(a.get("simulated") for a in allocations),
    )


class FractionalKubeSpawner(GpuLabServiceMixin, EnvironmentsMixin, KubeSpawner):
    enforcement = Unicode(
        "hami",
        help="""How a slice is held on the cluster: hami, mig, mps, timeslice,
        nvml-cgroup, kai, volcano or dra (docs/explanation/enforcement-backends.md).

        c.FractionalKubeSpawner.enforcement = "mig"
        """,
    ).tag(config=True)

    enforcement_options = Dict(
        help="""Options of the enforcement backend (each backend lists its own; an
        unknown one is an error at start).

        c.FractionalKubeSpawner.enforcement_options = {"queue": "research"}
        """,
    ).tag(config=True)

    notebook_priority_class = Unicode(
        help="""PriorityClass of notebook pods: above every job's, so that no job's
        preemption (Kueue, KAI) can evict a notebook. The Helm chart creates
        and sets it (with Kueue on); empty: none.

        c.FractionalKubeSpawner.notebook_priority_class = "gpulab-notebook"
        """,
    ).tag(config=True)

    @validate("enforcement")
    def _check_enforcement(self, proposal):
        if proposal["value"] not in backend_names():
            raise ValueError(
                f"unknown enforcement backend {proposal['value']!r}; choose one "
                f"of: {', '.join(backend_names())}"
            )
        return proposal["value"]

    @default("profile_list")
    def _profile_list_default(self):
        return self._slice_profiles

    @validate("profile_list")
    def _slices_unless_given(self, proposal):
        # z2jh sets c.KubeSpawner.profile_list = [] (singleuser.profileList):
        # an empty list means the slice sizes here, not "no form".
        return proposal["value"] or self._slice_profiles

    @default("options_from_form")
    def _options_from_form_default(self):
        return self._slice_options_from_form

    _slice_patch: SlicePatch | None = None
    #: The image configured (c.KubeSpawner.image), before an environment's replaced it.
    _configured_image: str | None = None
    _environment_name = ""
    environment_keys = ("image",)

    async def _slice_profiles(self, spawner=None) -> list[dict]:
        availability = await self._client().request(
            "GET", "/availability", query={"user": self.user.name}
        )
        inventory = await self._client().request("GET", "/inventory")
        offered = self.offered_environments()
        title = self.site_environments().default_title
        choice = environment_option(offered, title) if offered else None
        return profiles_from_availability(availability, inventory, choice)

    def _slice_options_from_form(self, formdata) -> dict:
        value = (formdata.get("gpu_milli") or [None])[0]
        slug = (formdata.get("profile") or [profile_slug(0)])[0]
        if value is None:
            value = normalize_user_options({"profile": slug})["gpu_milli"]
        try:
            options = {"gpu_milli": parse_gpu_milli(value)}
        except SliceError as e:
            raise web.HTTPError(400, f"invalid user_options: {e}") from None
        # KubeSpawner's form names a profile's option profile-option-<slug>--<option>.
        picked = (formdata.get(f"profile-option-{slug}--environment") or [OWN_IMAGE])[0]
        if picked != OWN_IMAGE:
            options["environment"] = picked
        return options

    async def load_user_options(self):
        # Slices are not KubeSpawner profiles with overrides (which would merge
        # into traits of this long-lived object and outlive the spawn): the size
        # is read in _start() and rendered into the pod by the enforcement backend.
        pass

    def start(self):
        self._slice_patch = None  # nothing of an earlier spawn survives
        self.begin_progress()
        return super().start()

    async def progress(self):
        """gpulab's events (placement, enforcement) first, then KubeSpawner's own:
        the pod's scheduling and image pull events."""
        async for event in self.gpulab_progress(until=STARTING_LAB):
            yield event
        async for event in super().progress():
            yield event

    async def _start(self):
        milli = parse_user_options(normalize_user_options(self.user_options))
        # The picked environment's image for this start only (the configured one kept).
        if self._configured_image is None:
            self._configured_image = self.image
        self._environment_name, env = self.chosen_environment()
        self.image = env.get("image") or self._configured_image
        try:
            options = check_backend(self.enforcement, self.enforcement_options)
        except EnforcementError as e:
            raise web.HTTPError(500, f"gpulab is misconfigured: {e}") from None
        allocations = await self._allocate(milli)
        try:
            inventory = await self._client().request("GET", "/inventory") if allocations else {}
            the_slice = slice_from_allocations(allocations, inventory)
            try:
                self._slice_patch = pod_slice_patch(self.enforcement, the_slice, options=options)
            except EnforcementError as e:
                raise web.HTTPError(409, f"cannot hold {label(milli)} here: {e}") from None
            self.log.info(
                "%s holds %s on %s via %s",
                self._owner,
                label(milli),
                the_slice.node or "no GPU",
                self.enforcement,
            )
            self.gpulab_placement = placement_of(milli, allocations, inventory)
            self.report_progress(40, self.gpulab_placement.sentence())
            await self._create_claims()
            self.report_progress(50, kube_enforcement(self.enforcement, the_slice.simulated, milli))
            self.report_progress(60, STARTING_LAB)
            return await super()._start()
        except BaseException:
            try:
                await self._delete_claim()
            finally:
                await self._release()
            raise

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            await self._delete_claim()

    # -- DRA: the server's ResourceClaim ------------------------------------------------
    @property
    def claim_name(self) -> str:
        """The server's own ResourceClaim under ``dra``: ``<pod name>-gpu``."""
        return f"{self.pod_name}-gpu"

    async def _create_claims(self) -> None:
        """The slice's claim, before the pod that references it (a claim left by an
        earlier start of this server is replaced: a claim's spec cannot change)."""
        from kubernetes_asyncio.client import CustomObjectsApi
        from kubernetes_asyncio.client.exceptions import ApiException

        patch = self._slice_patch
        if patch is None or patch.claim is None:
            return
        custom = CustomObjectsApi(self.api.api_client)
        labels = {"app.kubernetes.io/managed-by": "gpulab"}
        for obj in dra.claim_objects(patch, self.claim_name, template=False, labels=labels):
            if not patch.claim.shared_name:
                obj["metadata"]["annotations"] = {"gpulab.io/server": self._owner}
            where = ("resource.k8s.io", "v1", self.namespace, "resourceclaims")
            try:
                await custom.create_namespaced_custom_object(*where, obj)
            except ApiException as e:
                if e.status != 409:
                    raise
                if not patch.claim.shared_name:  # the card's shared claim is kept
                    await custom.delete_namespaced_custom_object(*where, self.claim_name)
                    await custom.create_namespaced_custom_object(*where, obj)

    async def _delete_claim(self) -> None:
        """Delete the server's own claim (never a card's shared one); gone is fine."""
        from kubernetes_asyncio.client import CustomObjectsApi
        from kubernetes_asyncio.client.exceptions import ApiException

        if self.enforcement != dra.NAME:
            return
        try:
            await CustomObjectsApi(self.api.api_client).delete_namespaced_custom_object(
                "resource.k8s.io", "v1", self.namespace, "resourceclaims", self.claim_name
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def get_env(self):
        env = strip_enforcement_vars(super().get_env())
        if self._slice_patch is not None:
            env.update(self._slice_patch.env)
        env.update(self.service_env())
        if self._environment_name:
            env[ENVIRONMENT_ENV] = self._environment_name
        return env

    async def get_pod_manifest(self):
        pod = await super().get_pod_manifest()
        if self._slice_patch is not None:
            queueing = queue_patch("server", notebook_priority_class=self.notebook_priority_class)
            claim = None
            if self._slice_patch.claim is not None:
                claim = dra.pod_claim_source(self._slice_patch, self.claim_name, template=False)
            patch_pod_model(pod, self._slice_patch, queueing, claim)
        return pod


def patch_pod_model(pod, patch: SlicePatch, queueing: dict, claim: dict | None = None) -> None:
    """Apply a slice patch to KubeSpawner's V1Pod (its env is already in get_env)."""
    meta, spec = pod.metadata, pod.spec
    annotations = {**without_gpu_annotations(meta.annotations), **patch.annotations}
    meta.annotations = annotations or None
    if patch.labels or queueing["labels"]:
        meta.labels = {**(meta.labels or {}), **patch.labels, **queueing["labels"]}
    if patch.scheduler_name:
        spec.scheduler_name = patch.scheduler_name
    if patch.node_selector:
        spec.node_selector = {**(spec.node_selector or {}), **patch.node_selector}
    if patch.tolerations:
        have = list(spec.tolerations or [])
        seen = {(t.key, t.operator, t.effect) for t in have}
        spec.tolerations = have + [
            V1Toleration(**t)
            for t in patch.tolerations
            if (t["key"], t["operator"], t["effect"]) not in seen
        ]
    if queueing["priority_class_name"]:  # gpulab's setting wins over z2jh's podPriority
        spec.priority_class_name = queueing["priority_class_name"]
    container = spec.containers[0]
    res = container.resources or V1ResourceRequirements()
    res.limits = {
        **without_gpu_resources(res.limits),
        **{k: str(v) for k, v in patch.limits.items()},
    }
    res.requests = without_gpu_resources(res.requests)
    if claim is not None:  # DRA: the devices come from the claim, named in the container
        have = [c for c in spec.resource_claims or [] if c.name != claim["name"]]
        spec.resource_claims = have + [
            V1PodResourceClaim(
                name=claim["name"],
                resource_claim_name=claim.get("resourceClaimName"),
                resource_claim_template_name=claim.get("resourceClaimTemplateName"),
            )
        ]
        named = [c for c in res.claims or [] if c.name != claim["name"]]
        res.claims = named + [CoreV1ResourceClaim(name=claim["name"])]
    container.resources = res
