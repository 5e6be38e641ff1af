"""``!torchrun`` in a notebook of a server gpulab spawns: the user's account finds a
torchrun it may run (their own environment's), not root's shims on the hub's PATH
("Permission denied"), and ``python -m torch.distributed.run`` works the same."""

import pytest
from hubproc import fresh_user
from kernelexec import run_in_kernel

pytestmark = pytest.mark.slow

USER = fresh_user("torchrun")


@pytest.fixture(scope="module")
def hub(plain_hub):
    return plain_hub


#: Each rank says who it is in one write: two ranks' ``print`` pieces interleave on
#: the shared pipe ("rankrank 0 of 2" was seen on CI).
RANKS = (
    "import os\n"
    "os.write(1, ('rank %s of %s\\n' % (os.environ['RANK'], os.environ['WORLD_SIZE'])).encode())\n"
)


def test_torchrun_runs_a_script_from_a_notebook(hub):
    token = hub.create_user(USER)
    hub.spawn_ready({USER: {"gpu_milli": 0}})
    env_bin = hub.home(USER) / ".gpulab" / "env" / "bin"
    out = run_in_kernel(
        f"{hub.url}/user/{USER}",
        token,
        "import os, shutil\n"
        "print('found', shutil.which('torchrun'))\n"
        "path = os.environ['PATH'].split(':')\n"
        "print('unreachable', [p for p in path if p.startswith('/root')])\n"
        f"open('ranks.py', 'w').write({RANKS!r})\n"
        "!torchrun --standalone --nproc-per-node 2 ranks.py 2>&1 | grep rank | sort\n"
        "!python -m torch.distributed.run --standalone --nproc-per-node 1 ranks.py 2>&1 "
        "| grep rank",
        timeout=180,
    ).replace("\r\n", "\n")
    assert f"found {env_bin / 'torchrun'}" in out, out
    assert "unreachable []" in out, out
    assert "rank 0 of 2\nrank 1 of 2\nrank 0 of 1" in out, out
    assert "Permission denied" not in out
