"""The vector engine's socket folder (in /tmp: a socket's path is short) does not
outlive the service: a killed service's is removed by the next service on the data dir."""

import os
import tempfile

from gpulab.service.vectors.engine_process import EngineProcess


def test_the_next_service_removes_the_socket_folder_a_killed_one_left(tmp_path):
    killed = EngineProcess(str(tmp_path))
    killed.prepare()
    left = killed.socket_dir
    assert os.path.dirname(left) == tempfile.gettempdir() and os.path.isdir(left)
    # The service is killed: its stop() never runs. The next one prepares its own.
    nxt = EngineProcess(str(tmp_path))
    nxt.prepare()
    try:
        assert not os.path.exists(left)
        assert os.path.isdir(nxt.socket_dir) and nxt.socket_dir != left
    finally:
        os.rmdir(nxt.socket_dir)


def test_a_name_file_pointing_elsewhere_removes_nothing(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (tmp_path / "vector-engine.socket-dir").write_text(str(keep))
    process = EngineProcess(str(tmp_path))
    process.prepare()
    try:
        assert keep.is_dir()
    finally:
        os.rmdir(process.socket_dir)
