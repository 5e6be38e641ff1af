"""The launcher's rendezvous port: node rank 0 picks a free one and the other nodes
read it from the job dir (end to end, across two sandbox nodes: test_slurm_jobs.py)."""

import socket
import threading
import time

import pytest

from gpulab.backend import slurm_launch


@pytest.fixture
def job_dir(tmp_path, monkeypatch):
    (tmp_path / "pids").mkdir()
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    return str(tmp_path)


def test_node_0_picks_a_free_port_and_the_others_read_it(job_dir):
    seen = []
    other = threading.Thread(target=lambda: seen.append(slurm_launch.rendezvous_port(job_dir, 1)))
    other.start()  # node 1 starts first and waits
    time.sleep(0.5)
    port = slurm_launch.rendezvous_port(job_dir, 0)
    other.join(10)
    assert seen == [port]
    with socket.socket() as s:  # free on node 0 (torchrun's store binds it next)
        s.bind(("", port))


def test_a_port_taken_on_the_node_is_not_picked(job_dir):
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        ports = {slurm_launch.rendezvous_port(job_dir, 0) for _ in range(20)}
        assert taken.getsockname()[1] not in ports


def test_a_requeued_job_does_not_read_the_port_of_its_last_run(job_dir, monkeypatch):
    slurm_launch.rendezvous_port(job_dir, 0)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with pytest.raises(slurm_launch.NoPort, match="shared filesystem"):
        slurm_launch.rendezvous_port(job_dir, 1, wait_s=0.5)


def test_a_node_that_sees_no_port_fails_with_the_reason_in_its_log(job_dir, tmp_path, monkeypatch):
    (tmp_path / "logs").mkdir()
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "node1.json").write_text('{"argv": ["true"], "env": {}}')
    (tmp_path / "slurm" / "nodes.json").write_text('{"sbn1": 1}')
    monkeypatch.setenv("SLURMD_NODENAME", "sbn1")
    monkeypatch.setattr(slurm_launch, "PORT_WAIT_S", 0.5)
    assert slurm_launch.launch(job_dir) == 1
    assert (tmp_path / "pids" / "node1.exit").read_text() == "1\n"
    assert "wrote no rendezvous port" in (tmp_path / "logs" / "node1.log").read_text()
