"""Elastic training engines on one machine: torchrun elastic, relaunch, TorchFT.

Measures what the elastic-training choice (torchrun elastic vs TorchFT) turns on,
with 2 "nodes" = 2 processes on this machine, gloo on CPU, the same small MLP
(3 hidden layers of 512, batch 64, SGD with momentum, one thread per process)
and the same per-step data for every engine. Every worker appends one line per
finished step (wall-clock time, step, rank, world size, writer, committed) to a
log file; all numbers below are read from those lines.

1. Step time at a fixed size of 2 (no membership change), median of the
   step-to-step gaps of one writer after ``WARMUP`` steps at size 2:
   - ``torchrun``: two static-rendezvous agents (``--nnodes=2``), DDP;
   - ``torchrun elastic``: two agents with ``--nnodes=1:2`` and the c10d
     rendezvous, DDP (the same per-step code; only the launch differs);
   - ``torchft``: a Lighthouse and two replica groups of one process each,
     torchft's Manager + ProcessGroupGloo + its DistributedDataParallel and
     OptimizerWrapper (quorum and should_commit every step).
   The ratio is to ``torchrun`` (best of ``--rounds`` alternating rounds).

2. Resize pauses. Each run goes 2 -> 1 -> 2 and waits for ``RESIZE_STEPS``
   steps at each size before the next event:
   - shrink: one node dies (SIGKILL of its agent and workers, or of the
     replica group). Pause = from the kill to the first step finished at size 1.
   - grow: a new node is started. "grow pause" = longest time without a finished
     step between the start and the first step at size 2 (+ a few steps);
     "grow to 2" = from the start to the first step at size 2.
   - ``torchrun elastic``: the workers save model + optimizer state on SIGTERM
     (at a step boundary) or when a collective fails, and load it at start, as
     gpulab's ranks do. Shrink: the survivor's worker fails, its agent restarts
     it and re-rendezvouses alone once the dead agent's keep-alive lapses.
     Grow: a new agent joins the rendezvous; the running agent restarts its
     worker and both start at size 2. The agent that hosts the c10d store is
     never the one killed (killing it ends the job).
   - ``relaunch`` (what gpulab's service does for a local/Slurm job): SIGTERM to
     every agent (workers checkpoint at a step boundary and exit), then a fresh
     static torchrun at the new size loads the checkpoint. Pause = from the stop
     request to the first step at the new size, for both directions.
   - ``torchft``: kill one replica group; the survivor's allreduce fails, that
     step is not committed, and the Lighthouse forms a quorum of 1 once the dead
     group's heartbeat times out. Grow: start a new replica group; the survivor
     keeps stepping, the joiner heals from it (HTTP checkpoint transfer) and
     takes part; "grow to 2" is the join latency (start of the process to its
     first committed step in a quorum of 2).

Python start-up (importing torch, ~1-3 s here) is inside every pause where a
process has to start, as it would be on a real node.

    python benchmarks/elastic_engines.py [--steps 200] [--rounds 2]

TorchFT rows need the ``torchft`` package (not a project dependency). Without it
the script prints the torchrun rows and how to get the rest: run it with a
Python that has torchft, or pass ``--torchft-python`` (see ``TORCHFT_HINT``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HIDDEN, LAYERS, BATCH = 512, 3, 64
WARMUP = 10  # steps at a size before its step times count
RESIZE_STEPS = 30  # steps at each size in the resize runs
LAST_CALL_S = 1  # torchrun rendezvous: wait for more nodes once min is reached
# torchrun rendezvous: a node is dead after this many missed 1 s keep-alives (2 is
# too tight: heartbeats land every 1-2 s and a live node gets dropped).
KEEP_ALIVE_S, KEEP_ALIVE_MISSES = 1, 3
# torch 2.13: with the rendezvous TCPStore shared with the workers (the default),
# an agent that joins a running job waits for round 1's MASTER_ADDR, which the
# running agent never writes again: growth hangs 60 s and the joiner fails.
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
FT_HEARTBEAT_MS = 1000  # Lighthouse: a replica without heartbeat this long is dead
FT_JOIN_MS = 1000  # Lighthouse: wait for stragglers before a new quorum
TORCHFT_HINT = (
    "python3 -m venv /work/tftvenv && "
    "echo $PWD/.venv/lib/python3.11/site-packages > /work/tftvenv/lib/python3.11/site-packages/main.pth && "
    "/work/tftvenv/bin/pip install --no-deps torchft && "
    "/work/tftvenv/bin/pip install 'opentelemetry-sdk>=1.39' 'opentelemetry-api>=1.39' "
    "'opentelemetry-exporter-otlp-proto-http>=1.39'; then "
    "/work/tftvenv/bin/python benchmarks/elastic_engines.py (or --torchft-python /work/tftvenv/bin/python)"
)


# ---------------------------------------------------------------- workload


def make_model():
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, 1))


def make_batch(step: int, rank: int):
    import torch

    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(BATCH, HIDDEN, generator=g)
    return x, x[:, :1].sin()


def train_step(model, opt, step: int, rank: int) -> None:
    x, y = make_batch(step, rank)
    opt.zero_grad()
    (model(x) - y).pow(2).mean().backward()
    opt.step()


class StepLog:
    """Appends ``time step rank world writer committed`` per finished step."""

    def __init__(self, path: str, writer: str):
        self.f = open(path, "a", buffering=1)  # noqa: SIM115 - open for the worker's life
        self.writer = writer

    def write(self, step: int, rank: int, world: int, committed: bool = True) -> None:
        self.f.write(f"{time.time():.6f} {step} {rank} {world} {self.writer} {int(committed)}\n")


# ---------------------------------------------------------------- workers


def torchrun_worker(log_path: str, ckpt: str, steps: int) -> None:
    """One torchrun rank: DDP, checkpoint on SIGTERM or a failed collective."""
    import torch
    import torch.distributed as dist

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    log = StepLog(log_path, "torchrun") if rank == 0 else None

    def save():  # every rank holds the same state; the last atomic replace wins
        tmp = f"{ckpt}.{os.getpid()}"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
        os.replace(tmp, ckpt)

    try:
        while step < steps and not stop:
            train_step(ddp, opt, step, rank)
            step += 1
            if log:
                log.write(step, rank, world)
    except Exception:
        save()  # the step in flight never reached opt.step(): state is at `step`
        raise
    save()
    if not stop:
        dist.destroy_process_group()


def torchft_worker(log_path: str, lighthouse: str, replica: str, steps: int, grads: str) -> None:
    """One replica group of one process under torchft's Manager.

    ``grads="flat"``: one ``manager.allreduce`` of all gradients per step (what
    DDP's single bucket does for this model). ``grads="ddp"``: torchft's
    DistributedDataParallel wrapper, fixed size only: in torchft 0.2.0 its comm
    hook asserts when a peer dies (``_ManagedWork.wait`` reports the error before
    the future it returns is set), so the survivor crashes instead of shrinking.
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo
    from torchft.optim import OptimizerWrapper

    log = StepLog(log_path, replica)
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = timedelta(seconds=10)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=lambda s: (
            model.load_state_dict(s["model"]),
            inner.load_state_dict(s["opt"]),
        ),
        state_dict=lambda: {"model": model.state_dict(), "opt": inner.state_dict()},
        min_replica_size=1,
        replica_id=replica,
        lighthouse_addr=lighthouse,
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        hostname="127.0.0.1",
        timeout=timeout,
        quorum_timeout=timedelta(seconds=60),
        connect_timeout=timeout,
    )
    net = DistributedDataParallel(manager, model) if grads == "ddp" else model
    opt = OptimizerWrapper(manager, inner)
    log.write(-1, 0, 0, committed=False)  # ready: imports, model, optimizer, Manager

    def allreduce_grads():  # averaged over the participants; errors go to should_commit
        params = [p for p in model.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        manager.allreduce(flat).wait()
        for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad.copy_(g.view_as(p.grad))

    try:
        while manager.current_step() < steps:
            step = manager.current_step()
            x, y = make_batch(step, int(replica[1:]))
            opt.zero_grad()  # starts the (async) quorum
            (net(x) - y).pow(2).mean().backward()
            if grads == "flat":
                allreduce_grads()
            world, taking_part = manager.num_participants(), manager.is_participating()
            opt.step()  # should_commit: steps the optimizer only if every group agrees
            committed = manager.current_step() > step
            log.write(manager.current_step(), int(taking_part), world, committed and taking_part)
    finally:
        manager.shutdown(wait=False)


def lighthouse(port: int) -> None:
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(
        bind=f"[::]:{port}",
        min_replicas=1,
        join_timeout_ms=FT_JOIN_MS,
        heartbeat_timeout_ms=FT_HEARTBEAT_MS,
    )
    signal.signal(signal.SIGTERM, lambda *_: (server.shutdown(), sys.exit(0)))
    while True:
        time.sleep(3600)


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


class Procs:
    """Processes this benchmark started; each can be killed with all its descendants
    (torchrun starts its workers in sessions of their own)."""

    def __init__(self, tmp: Path):
        self.tmp, self.procs, self.n = tmp, [], 0

    def start(self, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        self.n += 1
        out = open(self.tmp / f"proc{self.n}.out", "w")  # noqa: SIM115 - closed with the process
        env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        p = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        p.out_path = out.name
        self.procs.append(p)
        return p

    @staticmethod
    def tree(p: subprocess.Popen) -> list:
        import psutil

        try:
            root = psutil.Process(p.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self, p: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        for q in self.tree(p):
            with contextlib.suppress(Exception):
                q.send_signal(sig)
        if sig == signal.SIGKILL:
            p.wait()

    @staticmethod
    def failure(p: subprocess.Popen) -> RuntimeError:
        tail = "".join(Path(p.out_path).read_text().splitlines(True)[-25:])
        return RuntimeError(f"{' '.join(map(str, p.args[:6]))} ... exited {p.returncode}:\n{tail}")

    def close(self) -> None:
        for p in self.procs:
            self.kill(p)
        self.procs = []


def torchrun_cmd(script_args: list[str], nnodes: str, rdzv: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
        "--nproc-per-node=1", "--monitor-interval=0.1", *rdzv,
        __file__, "--worker", "torchrun", *script_args,
    ]  # fmt: skip


def static_agents(procs: Procs, n: int, args: list[str]) -> list[subprocess.Popen]:
    port = free_port()
    return [
        procs.start(
            torchrun_cmd(
                args, str(n),
                ["--rdzv-backend=static", "--master-addr=127.0.0.1", f"--master-port={port}", f"--node-rank={i}"],
            )
        )
        for i in range(n)
    ]  # fmt: skip


def elastic_agent(procs: Procs, port: int, args: list[str], host: bool) -> subprocess.Popen:
    """An agent of the ``--nnodes=1:2`` job. Exactly one hosts the c10d store: on one
    machine every agent would otherwise take 127.0.0.1 for itself and start its own."""
    conf = (
        f"last_call_timeout={LAST_CALL_S},keep_alive_interval={KEEP_ALIVE_S},"
        f"keep_alive_max_attempt={KEEP_ALIVE_MISSES},is_host={int(host)}"
    )
    rdzv = [
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=bench",
        f"--rdzv-conf={conf}", "--max-restarts=5",
    ]  # fmt: skip
    return procs.start(torchrun_cmd(args, "1:2", rdzv), env=ELASTIC_ENV)


# ---------------------------------------------------------------- step logs


@dataclass
class Step:
    t: float
    step: int
    rank: int
    world: int
    writer: str
    committed: bool


def read_log(path: Path) -> list[Step]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if len(line.split()) != 6:
            continue  # a line being written
        t, step, rank, world, writer, ok = line.split()
        rows.append(Step(float(t), int(step), int(rank), int(world), writer, ok == "1"))
    return rows


def done_steps(path: Path, writer: str | None = None) -> list[Step]:
    """Finished (committed) steps, optionally of one writer."""
    return [s for s in read_log(path) if s.committed and (writer is None or s.writer == writer)]


def wait_steps(path: Path, world: int, n: int, since: float, procs: list, timeout: float = 180):
    """Until ``n`` steps at ``world`` finished after ``since``; fail early if a process died."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if sum(s.world == world and s.t > since for s in done_steps(path)) >= n:
            return
        for p in procs:
            if p.poll() not in (None, 0):
                raise Procs.failure(p)
        time.sleep(0.05)
    raise TimeoutError(f"no {n} steps at size {world} within {timeout}s ({path})")


def median_step_ms(path: Path, writer: str) -> float:
    at2 = [s for s in done_steps(path, writer) if s.world == 2][WARMUP:]
    gaps = [b.t - a.t for a, b in zip(at2, at2[1:], strict=False) if b.step == a.step + 1]
    return 1000 * statistics.median(gaps)


def first_at(path: Path, world: int, since: float, writer: str | None = None) -> float:
    return min(s.t for s in done_steps(path, writer) if s.world == world and s.t > since) - since


def longest_gap(path: Path, start: float, end: float, writer: str | None = None) -> float:
    """Longest time without a finished step in [start, end]."""
    ts = [start, *sorted(s.t for s in done_steps(path, writer) if start < s.t < end), end]
    return max(b - a for a, b in zip(ts, ts[1:], strict=False))


# ---------------------------------------------------------------- fixed size


def fixed_torchrun(tmp: Path, steps: int, elastic: bool) -> float:
    log = tmp / f"fixed-{'elastic' if elastic else 'static'}-{time.time_ns()}.log"
    args = ["--steps-file", str(log), "--ckpt", str(tmp / f"{log.stem}.pt"), "--steps", str(steps)]
    procs = Procs(tmp)
    try:
        if elastic:  # started together, so that they start at size 2
            port = free_port()
            agents = [elastic_agent(procs, port, args, host=i == 0) for i in range(2)]
        else:
            agents = static_agents(procs, 2, args)
        for p in agents:
            p.wait(timeout=900)
        # When the agent hosting the c10d store exits after the last step, the
        # other one can fail to reach the store: the steps tell if the run finished.
        last = max((s.step for s in done_steps(log)), default=0)
        for p in agents:
            if p.returncode and last < steps:
                raise Procs.failure(p)
    finally:
        procs.close()
    return median_step_ms(log, "torchrun")


def start_lighthouse(procs: Procs, ft_python: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    p = procs.start([ft_python, __file__, "--lighthouse", str(port)])
    wait_port(port)
    return p, f"http://127.0.0.1:{port}"


def ft_replica(procs, ft_python, log, lh, name, steps, grads="flat") -> subprocess.Popen:
    args = [
        "--steps-file",
        str(log),
        "--lighthouse-addr",
        lh,
        "--replica",
        name,
        "--steps",
        str(steps),
    ]
    args += ["--grads", grads]
    return procs.start([ft_python, __file__, "--worker", "torchft", *args])


def fixed_torchft(tmp: Path, steps: int, ft_python: str, grads: str) -> float:
    log = tmp / f"fixed-torchft-{time.time_ns()}.log"
    procs = Procs(tmp)
    try:
        _, lh = start_lighthouse(procs, ft_python)
        reps = [ft_replica(procs, ft_python, log, lh, f"r{i}", steps, grads) for i in range(2)]
        for p in reps:
            if p.wait(timeout=900):
                raise Procs.failure(p)
    finally:
        procs.close()
    return median_step_ms(log, "r0")


# ---------------------------------------------------------------- resizes


@dataclass
class Resize:
    shrink_s: float  # event -> first step at size 1
    grow_gap_s: float  # longest time without a finished step while growing
    grow_s: float  # event -> first step at size 2
    note: str = ""


def resize_elastic(tmp: Path) -> Resize:
    log, procs = tmp / "resize-elastic.log", Procs(tmp)
    args = [
        "--steps-file",
        str(log),
        "--ckpt",
        str(tmp / "resize-elastic.pt"),
        "--steps",
        "10000000",
    ]
    port = free_port()
    try:
        host = elastic_agent(procs, port, args, host=True)
        wait_port(port)
        other = elastic_agent(procs, port, args, host=False)
        wait_steps(log, 2, RESIZE_STEPS, 0, [host, other])
        t_kill = time.time()
        procs.kill(other)  # the node dies: its agent and its worker
        wait_steps(log, 1, RESIZE_STEPS, t_kill, [host])
        t_join = time.time()
        joiner = elastic_agent(procs, port, args, host=False)
        wait_steps(log, 2, RESIZE_STEPS, t_join, [host, joiner])
    finally:
        procs.close()
    grow = first_at(log, 2, t_join)
    return Resize(first_at(log, 1, t_kill), longest_gap(log, t_join, t_join + grow + 1), grow)


def relaunch_to(procs: Procs, old: list, n: int, args: list[str]) -> list:
    """Stop request to every agent (workers checkpoint and exit), then a fresh launch."""
    for p in old:
        p.send_signal(signal.SIGTERM)
    for p in old:
        p.wait(timeout=60)
    return static_agents(procs, n, args)


def resize_relaunch(tmp: Path) -> Resize:
    log, procs = tmp / "resize-relaunch.log", Procs(tmp)
    args = [
        "--steps-file",
        str(log),
        "--ckpt",
        str(tmp / "resize-relaunch.pt"),
        "--steps",
        "10000000",
    ]
    try:
        agents = static_agents(procs, 2, args)
        wait_steps(log, 2, RESIZE_STEPS, 0, agents)
        t_shrink = time.time()
        agents = relaunch_to(procs, agents, 1, args)
        wait_steps(log, 1, RESIZE_STEPS, t_shrink, agents)
        t_grow = time.time()
        agents = relaunch_to(procs, agents, 2, args)
        wait_steps(log, 2, RESIZE_STEPS, t_grow, agents)
    finally:
        procs.close()
    grow = first_at(log, 2, t_grow)
    return Resize(first_at(log, 1, t_shrink), longest_gap(log, t_grow, t_grow + grow + 1), grow)


def resize_torchft(tmp: Path, ft_python: str) -> Resize:
    log, procs = tmp / "resize-torchft.log", Procs(tmp)
    try:
        lh_proc, lh = start_lighthouse(procs, ft_python)
        survivor = ft_replica(procs, ft_python, log, lh, "r0", 10_000_000)
        victim = ft_replica(procs, ft_python, log, lh, "r1", 10_000_000)
        wait_steps(log, 2, 2 * RESIZE_STEPS, 0, [lh_proc, survivor, victim])
        t_kill = time.time()
        procs.kill(victim)
        wait_steps(log, 1, RESIZE_STEPS, t_kill, [lh_proc, survivor])
        t_join = time.time()
        joiner = ft_replica(procs, ft_python, log, lh, "r2", 10_000_000)
        wait_steps(log, 2, 2 * RESIZE_STEPS, t_join, [lh_proc, survivor, joiner])
    finally:
        procs.close()
    grow = first_at(log, 2, t_join, "r2")
    started = min(s.t for s in read_log(log) if s.writer == "r2") - t_join
    return Resize(
        first_at(log, 1, t_kill, "r0"),
        longest_gap(log, t_join, t_join + grow + 1, "r0"),
        grow,
        f"joiner ready (imports, Manager) after {started:.1f}s",
    )


# ---------------------------------------------------------------- main


def torchft_python(flag: str | None) -> str | None:
    if flag:
        return flag
    return sys.executable if importlib.util.find_spec("torchft") else None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="steps per fixed-size run")
    p.add_argument("--rounds", type=int, default=2, help="alternating fixed-size rounds")
    p.add_argument(
        "--torchft-python", help="interpreter with torchft (default: this one, if it has it)"
    )
    p.add_argument("--no-resize", action="store_true", help="only the fixed-size step times")
    args = p.parse_args(argv)
    ft_python = torchft_python(args.torchft_python)
    engines = ["torchrun", "torchrun elastic", *(["torchft", "torchft DDP"] if ft_python else [])]

    with tempfile.TemporaryDirectory(prefix="elastic-bench-") as tmp:
        tmp = Path(tmp)
        step_ms: dict[str, list[float]] = {e: [] for e in engines}
        for r in range(args.rounds):
            step_ms["torchrun"].append(fixed_torchrun(tmp, args.steps, elastic=False))
            step_ms["torchrun elastic"].append(fixed_torchrun(tmp, args.steps, elastic=True))
            if ft_python:
                step_ms["torchft"].append(fixed_torchft(tmp, args.steps, ft_python, "flat"))
                step_ms["torchft DDP"].append(fixed_torchft(tmp, args.steps, ft_python, "ddp"))
            print(
                f"round {r + 1}: " + "  ".join(f"{e} {v[-1]:.2f} ms" for e, v in step_ms.items()),
                flush=True,
            )
        resizes: dict[str, Resize] = {}
        if not args.no_resize:
            resizes["torchrun elastic"] = resize_elastic(tmp)
            resizes["relaunch"] = resize_relaunch(tmp)
            if ft_python:
                resizes["torchft"] = resize_torchft(tmp, ft_python)

    print_table(step_ms, resizes)
    if not ft_python:
        print(f"\nNo torchft in {sys.executable}: for the TorchFT rows run\n  {TORCHFT_HINT}")


NOTES = {
    "torchrun": "2 static agents, DDP",
    "torchrun elastic": f"--nnodes=1:2 c10d, last_call {LAST_CALL_S}s, keep-alive {KEEP_ALIVE_S}s x{KEEP_ALIVE_MISSES}",
    "relaunch": "SIGTERM all -> checkpoint -> fresh static torchrun at new size",
    "torchft": f"Manager.allreduce of flat grads + OptimizerWrapper; Lighthouse heartbeat {FT_HEARTBEAT_MS}ms join {FT_JOIN_MS}ms",
    "torchft DDP": "torchft.DistributedDataParallel: survivor crashes on peer loss (0.2.0), fixed size only",
}


def print_table(step_ms: dict[str, list[float]], resizes: dict[str, Resize]) -> None:
    plain = min(step_ms["torchrun"])
    print(f"\n{'engine':17s} {'step ms (fixed 2)':>17s} {'x plain':>8s} {'shrink pause s':>15s} "
          f"{'grow pause s':>13s} {'grow to 2 s':>12s}  notes")  # fmt: skip
    for engine in NOTES:
        if engine not in step_ms and engine not in resizes:
            continue
        ms = f"{min(step_ms[engine]):.2f}" if engine in step_ms else "-"
        ratio = f"{min(step_ms[engine]) / plain:.3f}" if engine in step_ms else "-"
        r = resizes.get(engine)
        cols = [f"{x:.2f}" for x in (r.shrink_s, r.grow_gap_s, r.grow_s)] if r else ["-"] * 3
        note = "; ".join(x for x in (NOTES[engine], r.note if r else "") if x)
        print(
            f"{engine:17s} {ms:>17s} {ratio:>8s} {cols[0]:>15s} {cols[1]:>13s} {cols[2]:>12s}  {note}"
        )
    if len(next(iter(step_ms.values()))) > 1:
        print("step ms: best of rounds; per round: "
              + "; ".join(f"{e} " + "/".join(f"{x:.2f}" for x in v) for e, v in step_ms.items()))  # fmt: skip


def worker_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--worker", choices=["torchrun", "torchft"])
    p.add_argument("--lighthouse", type=int)
    p.add_argument("--steps-file")
    p.add_argument("--ckpt")
    p.add_argument("--steps", type=int)
    p.add_argument("--lighthouse-addr")
    p.add_argument("--replica")
    p.add_argument("--grads", choices=["flat", "ddp"])
    a = p.parse_args(argv)
    if a.lighthouse:
        lighthouse(a.lighthouse)
    elif a.worker == "torchrun":
        torchrun_worker(a.steps_file, a.ckpt, a.steps)
    else:
        torchft_worker(a.steps_file, a.lighthouse_addr, a.replica, a.steps, a.grads)


if __name__ == "__main__":
    if "--worker" in sys.argv or "--lighthouse" in sys.argv:
        worker_main(sys.argv[1:])
    else:
        main()
