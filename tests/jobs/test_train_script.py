"""``%train_distributed SCRIPT.py ARGS...``: an existing torchrun script, unchanged,
from a real notebook (nbclient, a real kernel) on the shared hub; and the few lines
a cell shows when it cannot run (a syntax error, a refused request, an exit).

The script is shaped as pytorch/examples' ``distributed/ddp-tutorial-series/
multinode.py``: a helper module beside it (``datautils.py``), argparse positional
``total_epochs save_every`` and ``--batch_size``, a ``snapshot.pt`` in the working
folder that a restart resumes from. Only gloo instead of NCCL (no GPU here).
"""

import os

import nbformat
import pytest
from hubproc import fresh_user
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

pytestmark = pytest.mark.slow

DATAUTILS = """
import torch
from torch.utils.data import Dataset


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]
"""

MULTINODE = """
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from datautils import MyTrainDataset

import torch.multiprocessing as mp
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group


def ddp_setup():
    init_process_group(backend="gloo")


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        steps = len(self.train_data)
        print(f"[GPU{self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {steps}")
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "EPOCHS_RUN": epoch,
        }
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            # The fault this test injects: once, before the third epoch.
            if os.environ.get("CRASH_ONCE") and epoch == 2 and self.epochs_run == 0:
                print("crashing on purpose", flush=True)
                os._exit(1)
            self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch + 1)


def load_train_objs():
    train_set = MyTrainDataset(256)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset, batch_size: int):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=True,
        shuffle=False,
        sampler=DistributedSampler(dataset)
    )


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str = "snapshot.pt"):
    ddp_setup()
    print(f"argv={sys.argv[1:]} cwd={os.getcwd()}")
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description='simple distributed training job')
    parser.add_argument('total_epochs', type=int, help='Total epochs to train the model')
    parser.add_argument('save_every', type=int, help='How often to save a snapshot')
    parser.add_argument('--batch_size', default=32, type=int, help='Input batch size')
    args = parser.parse_args()

    main(args.save_every, args.total_epochs, args.batch_size)
"""


@pytest.fixture(scope="module")
def hub(plain_hub):
    return plain_hub


@pytest.fixture
def user(hub, monkeypatch):
    """A fresh user whose project folder (in their home, theirs) holds the script;
    the kernel runs as this test, with the user's token, in that folder."""
    name = fresh_user("script")
    token = hub.create_user(name)
    monkeypatch.setenv("GPULAB_API_URL", hub.api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
    hub.write_home_file(name, "project/datautils.py", DATAUTILS)
    hub.write_home_file(name, "project/multinode.py", MULTINODE)
    return name, token, hub.home(name) / "project"


def notebook(cells, folder):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(s)
        for s in [
            "%load_ext gpulab.magics",
            "import os; os.environ['GPULAB_DISPLAY'] = 'text'",
            *cells,
        ]
    ]
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    )
    return nb, client


def text_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def error_of(cell) -> tuple[str, str]:
    [error] = [o for o in cell.outputs if o.output_type == "error"]
    return error["ename"], "\n".join(error["traceback"])


def test_the_ddp_tutorial_script_runs_unchanged_on_two_nodes_and_resumes_from_its_snapshot(
    hub, user
):
    name, token, project = user
    nb, client = notebook(
        [
            "%train_distributed --nodes 2 --max-restarts 1 --env CRASH_ONCE=1 "
            "multinode.py 4 1 --batch_size 16"
        ],
        project,
    )
    client.execute()
    out = text_of(nb.cells[2])
    assert "succeeded" in out and "1 restart" in out, out
    [job] = hub.gpulab("GET", "/jobs", token=token).json()
    assert job["world_size"] == 2 and job["restarts"] == 1
    logs = hub.gpulab("GET", f"/jobs/{job['id']}/logs", token=token).text
    # Its own arguments, the notebook's folder as the working folder (said first).
    assert f"gpulab: running {project / 'multinode.py'} in {project} (the notebook's folder)" in (
        logs
    ), logs
    assert f"argv=['4', '1', '--batch_size', '16'] cwd={project}" in logs, logs
    # The snapshot is the user's file in their folder; the restart resumed from it.
    snapshot = project / "snapshot.pt"
    assert snapshot.exists() and snapshot.stat().st_uid == project.stat().st_uid
    assert "crashing on purpose" in logs and "Resuming training from snapshot at Epoch 2" in logs
    assert "[GPU1] Epoch 3 | Batchsize: 16 | Steps: 8" in logs, logs


def test_a_script_that_exits_says_why_in_the_cell(hub, user):
    name, token, project = user
    nb, client = notebook(["%train_distributed multinode.py --batch_size 16"], project)
    with pytest.raises(CellExecutionError):
        client.execute()
    ename, shown = error_of(nb.cells[2])
    assert ename == "TrainingJobFailed"
    assert "rank 0 raised SystemExit: 2" in shown, shown
    assert "usage: multinode.py [-h] [--batch_size BATCH_SIZE] total_epochs save_every" in shown
    assert "error: the following arguments are required: total_epochs, save_every" in shown
    for internal in ("runner.py", "script.py", "_gpulab_run_script", "runpy", "site-packages"):
        assert internal not in shown, shown


def test_a_helper_module_beside_the_notebook_is_named_as_such(hub, user):
    """A cell (not the script) that imports the helper: the hint says it is a file
    beside the notebook and how to run it, not that a package is missing."""
    name, token, project = user
    nb, client = notebook(["%%train_distributed\nimport datautils\n"], project)
    with pytest.raises(CellExecutionError):
        client.execute()
    ename, shown = error_of(nb.cells[2])
    assert "ModuleNotFoundError: No module named 'datautils'" in shown, shown
    assert "`datautils` is datautils.py in this notebook's folder" in shown, shown
    assert "ask your admin" not in shown


def test_a_cell_that_does_not_compile_fails_in_the_notebook_before_anything_is_queued(
    hub, user, tmp_path
):
    name, token, project = user
    (tmp_path / "broken.py").write_text("import os\nprint(os.getcwd()\n")
    nb, client = notebook(
        [
            "%%train_distributed --nodes 2\nfrom gpulab.training import setup\nx = (1,\n",
            f"%train_distributed {tmp_path / 'broken.py'} --epochs 3",
            "%train_distributed no_such_script.py",
        ],
        project,
    )
    client.allow_errors = True
    client.execute()
    ename, shown = error_of(nb.cells[2])
    assert ename == "CellSyntaxError"
    # The cell's line 3 (the magic's line is its first) and Python's own words.
    assert 'File "<cell>", line 3' in shown and "SyntaxError: '(' was never closed" in shown
    assert "Traceback" not in shown and "magics/train" not in shown, shown
    ename, shown = error_of(nb.cells[3])
    assert f'File "{tmp_path / "broken.py"}", line 2' in shown, shown
    assert "SyntaxError: '(' was never closed" in shown and "Traceback" not in shown
    # IPython prints a UsageError's one line on stderr.
    assert "UsageError: no_such_script.py: no such file" in text_of(nb.cells[4])
    assert hub.gpulab("GET", "/jobs", token=token).json() == []


def test_more_gpus_than_exist_is_said_in_words_only(hub, user):
    name, token, project = user
    nb, client = notebook(["%%train_distributed --gpu 1 --nproc-per-node 3\nprint(1)\n"], project)
    with pytest.raises(CellExecutionError):
        client.execute()
    ename, shown = error_of(nb.cells[2])
    assert ename == "TrainingJobRefused"
    assert shown.startswith("TrainingJobRefused: job refused:") and "\n" not in shown, shown
    assert "magics/train.py" not in shown and "Traceback" not in shown
    assert os.path.basename(__file__) not in shown


def test_pythonpath_is_the_notebooks_folder_and_env_and_a_read_only_folder_sends_work_home(
    hub, user
):
    """The notebook's folder and ``--env PYTHONPATH=lib`` (from the notebook's folder)
    are on the script's path; a notebook folder the user may not write leaves the
    working folder in their home, as the first log line says."""
    name, token, _ = user
    hub.write_home_file(name, "shared/nbmod.py", "WHO = 'notebook'\n")
    hub.write_home_file(name, "shared/lib/libmod.py", "WHO = 'lib'\n")
    hub.write_home_file(
        name,
        "shared/tools/run.py",
        "import os\nimport nbmod, libmod\n"
        "print('imports', nbmod.WHO, libmod.WHO, 'PYTHONPATH', os.environ['PYTHONPATH'])\n"
        "open('written.txt', 'w').write('here')\n",
    )
    shared = hub.home(name) / "shared"
    shared.chmod(0o555)  # theirs to read, not to write
    nb, client = notebook(["%train_distributed --env PYTHONPATH=lib tools/run.py"], shared)
    client.execute()
    assert "succeeded" in text_of(nb.cells[2])
    [job] = hub.gpulab("GET", "/jobs", token=token).json()
    logs = hub.gpulab("GET", f"/jobs/{job['id']}/logs", token=token).text
    folder = hub.home(name) / "gpulab-jobs" / job["id"]
    assert (
        f"gpulab: running {shared / 'tools' / 'run.py'} in {folder} (a folder for this job "
        f"in your home; the notebook's folder {shared} is not writable here)"
    ) in logs, logs
    assert f"imports notebook lib PYTHONPATH {shared}:{shared / 'lib'}" in logs, logs
    assert (folder / "written.txt").read_text() == "here"
