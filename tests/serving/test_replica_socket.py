"""The model server on a Unix socket its parent bound (``--listen-fd``), the way the
service starts local replicas (:mod:`gpulab.backend.replica_sockets`): a real
server process, real sockets."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from support.unix_http import unix_request
from support.wait import wait_until

from gpulab.backend.local_replicas import LocalReplicas
from gpulab.backend.replica_sockets import ReplicaSockets, private_folder

START_S = 120  # a loaded 2-core machine imports torch slowly; a bound, not a sleep


def refused(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except ConnectionRefusedError:
            return True
    return False


def answers(path: str):
    try:
        return unix_request(path, "GET", "/v2/health/ready")[0] == 200
    except ConnectionRefusedError:
        return False


def test_serves_on_the_socket_it_was_handed_and_refuses_before_and_after(
    model_dirs, tiny_model, tmp_path
):
    sockets = ReplicaSockets(str(tmp_path / "deployments"))
    sock = sockets.bind("0123456789ab", 0)
    path = sockets.path("0123456789ab", 0)
    try:
        # Bound but nobody listens yet: refused at once, like a port nobody listens on.
        assert refused(path)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpulab.serving.server",
                "--model-dir",
                model_dirs["tiny"],
                "--listen-fd",
                str(sock.fileno()),
                "--threads",
                "1",
            ],
            pass_fds=(sock.fileno(),),
            stdout=subprocess.PIPE,
            text=True,
        )
    finally:
        sock.close()  # the server holds it now
    try:
        wait_until(lambda: answers(path), "the server to listen on its socket", START_S)
        x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
        status, body = unix_request(
            path,
            "POST",
            "/v2/models/tiny/infer",
            body={
                "inputs": [
                    {
                        "name": "input",
                        "shape": [2, 16],
                        "datatype": "FP32",
                        "data": x.ravel().tolist(),
                    }
                ]
            },
        )
        assert status == 200, body
        expected = tiny_model(torch.from_numpy(x)).detach().numpy()
        got = np.array(body["outputs"][0]["data"], np.float32).reshape(expected.shape)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        # Only this account (root, for the service) may enter the folder or use the socket.
        assert os.stat(sockets.folder).st_mode & 0o777 == 0o700
        assert os.stat(path).st_mode & 0o777 == 0o600
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert f"listening on unix:{path}" in out
    assert refused(path)  # gone with its server: nothing else holds the socket
    sockets.remove("0123456789ab")
    assert not os.path.exists(path)


def test_a_base_too_long_for_a_socket_path_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="set TMPDIR"):
        ReplicaSockets(str(tmp_path), base="/tmp/" + "x" * 80)


def test_a_socket_folder_someone_else_could_enter_is_refused(tmp_path):
    shared = tmp_path / "made-by-someone"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(PermissionError, match="not a folder of this account's alone"):
        private_folder(str(shared))
    mine = tmp_path / "mine"
    private_folder(str(mine))
    assert mine.stat().st_mode & 0o777 == 0o700


def test_a_replica_an_older_service_started_on_a_port_is_still_reached():
    # Records of replicas started before replicas had sockets name a port.
    assert LocalReplicas.address({"pid": 1, "port": 40193}) == "http://127.0.0.1:40193"
    assert LocalReplicas.address({"pid": 1, "socket": "/run/x.sock"}) == "unix:/run/x.sock"
