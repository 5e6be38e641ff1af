"""The OpenAI gateway's limits per user, as ``c.LlmSettings`` settings
(:mod:`.token_meter` applies them)."""

from __future__ import annotations

from traitlets import Dict, Int
from traitlets.config import Configurable

from gpulab.service.endpoints.token_meter import LlmLimits


class LlmSettings(Configurable):
    llm_max_streams_per_user = Int(
        0,
        min=0,
        help="""Generation calls (chat and completions through the OpenAI gateway,
        streamed or not) one user may have in flight at once; over it, 429 with
        Retry-After. A caller that goes away frees its slot. 0: no limit.

        c.LlmSettings.llm_max_streams_per_user = 4
        """,
    ).tag(config=True)

    llm_tokens_per_minute_per_user = Int(
        0,
        min=0,
        help="""Prompt and completion tokens one user's calls through the OpenAI
        gateway may use in a minute (the last 60 s); over it, 429 with Retry-After.
        0: no limit.

        c.LlmSettings.llm_tokens_per_minute_per_user = 20000
        """,
    ).tag(config=True)

    llm_max_streams_per_group = Dict(
        value_trait=Int(min=0),
        help="""Per hub group, llm_max_streams_per_user for its members instead of the
        default (a member of several gets the most generous; 0: no limit).

        c.LlmSettings.llm_max_streams_per_group = {"researchers": 16}
        """,
    ).tag(config=True)

    llm_tokens_per_minute_per_group = Dict(
        value_trait=Int(min=0),
        help="""Per hub group, llm_tokens_per_minute_per_user for its members instead of
        the default (a member of several gets the most generous; 0: no limit).

        c.LlmSettings.llm_tokens_per_minute_per_group = {"researchers": 200000}
        """,
    ).tag(config=True)

    training_files_quota_mib = Int(
        1024,
        min=1,
        help="""What one user's fine-tuning training files (`POST /v1/files`) may hold
        together on the service's disk, in MiB. An upload that would pass it is refused
        (413, with the numbers) and nothing of it is kept; deleting a file gives its room
        back.

        c.LlmSettings.training_files_quota_mib = 4096
        """,
    ).tag(config=True)

    max_open_fine_tuning_jobs = Int(
        8,
        min=1,
        help="""How many fine-tuning jobs (`POST /v1/fine_tuning/jobs`) one user may have
        queued or running at once; one more is refused (429, with how many are open)
        before its base model is read.

        c.LlmSettings.max_open_fine_tuning_jobs = 2
        """,
    ).tag(config=True)

    def llm_limits(self) -> LlmLimits:
        return LlmLimits(
            max_streams=self.llm_max_streams_per_user,
            tokens_per_minute=self.llm_tokens_per_minute_per_user,
            group_max_streams=dict(self.llm_max_streams_per_group),
            group_tokens_per_minute=dict(self.llm_tokens_per_minute_per_group),
        )
