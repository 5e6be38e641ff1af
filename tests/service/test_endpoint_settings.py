"""A deployment's create body, checked (:mod:`gpulab.service.endpoints.settings`): names
are whole-string matches, so a trailing newline is not a name."""

from __future__ import annotations

import pytest

from gpulab.service.endpoints.settings import (
    DeployRefused,
    EndpointLimits,
    check_create,
    check_sharing,
)

LIMITS = EndpointLimits(
    slice_sizes=(0, 1000),
    max_deployment_replicas=4,
    max_user_deployments=8,
    max_model_mib=1024,
    model_storage_quota_mib=4096,
    cold_start_seconds=60.0,
    stop_with_server=False,
    local=False,
)


def create(body: dict) -> dict:
    return check_create(LIMITS, "alice", body, lambda *_: None)


def test_a_name_with_a_trailing_newline_is_refused():
    assert create({"name": "chat"})["name"] == "chat"
    for name in ("chat\n", "chat\r\n", "\nchat"):
        with pytest.raises(DeployRefused) as refused:
            create({"name": name})
        assert refused.value.status == 400
        assert "'name' must be 1-63 lower-case letters" in str(refused.value)


def test_a_share_name_with_a_trailing_newline_is_refused():
    assert check_sharing({"share_users": ["bob"]}) == {"share_users": ["bob"]}
    for key in ("share_users", "share_groups"):
        with pytest.raises(DeployRefused) as refused:
            check_sharing({key: ["bob\n"]})
        assert refused.value.status == 400 and "is not a" in str(refused.value)
