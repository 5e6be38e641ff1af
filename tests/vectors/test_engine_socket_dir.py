"""The vector engine's socket folder (in /tmp: a socket's path is short) does not
outlive the service: a killed service's is removed by the next service on the data dir,
and a service built but never started makes none."""

import os
import tempfile

import pytest

from gpulab.service.vectors import socket_dir
from gpulab.service.vectors.engine_process import EngineProcess


def made(process: EngineProcess) -> str:
    """The folder as the engine's first start makes it."""
    socket_dir.make(process.data_dir, process.socket_dir)
    return process.socket_dir


def test_the_next_service_removes_the_socket_folder_a_killed_one_left(tmp_path):
    killed = EngineProcess(str(tmp_path))
    killed.prepare()
    left = made(killed)
    assert os.path.dirname(left) == tempfile.gettempdir() and os.path.isdir(left)
    # The service is killed: its stop() never runs. The next one prepares its own.
    nxt = EngineProcess(str(tmp_path))
    nxt.prepare()
    assert not os.path.exists(left)
    assert nxt.socket_dir != left and not os.path.exists(nxt.socket_dir)


def test_a_name_file_pointing_elsewhere_removes_nothing(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (tmp_path / "vector-engine.socket-dir").write_text(str(keep))
    process = EngineProcess(str(tmp_path))
    process.prepare()
    assert keep.is_dir()


def test_a_service_never_started_leaves_no_folder(tmp_path):
    process = EngineProcess(str(tmp_path))
    process.prepare()
    assert process.socket_dir.startswith(os.path.join(tempfile.gettempdir(), socket_dir.PREFIX))
    assert not os.path.exists(process.socket_dir)
    assert not (tmp_path / socket_dir.NAMED_IN).exists()


def test_a_folder_someone_made_first_is_refused(tmp_path):
    process = EngineProcess(str(tmp_path))
    process.prepare()
    os.mkdir(process.socket_dir, 0o777)  # as if another user had guessed the name
    try:
        with pytest.raises(RuntimeError, match="exists already: it was not made by this service"):
            made(process)
    finally:
        os.rmdir(process.socket_dir)
