"""The ``gpulab`` command: ``gpulab up`` starts the embedded platform.

``gpulab up`` runs JupyterHub in the foreground with gpulab's configuration:
configurable-http-proxy in front, per-user passwords with admin approval
(``--demo``: one shared password), the gpulab service (managed by the hub) and
the fractional spawner.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gpulab.spawner.form import DEMO_LOGIN_ENV

from . import single_account, slurm_cli
from .auth_config import login_banner
from .gpu_banner import gpus_line
from .hub_config import Settings
from .leftover_processes import end_leftovers
from .ports import free_port
from .tls import TLSError, tls_banner

HUB_CONFIG = Path(__file__).with_name("jupyterhub_config.py")


def _internal_ports(data_dir: Path) -> dict[str, int]:
    """Ports for the hub, the proxy API and the service, kept across restarts.

    Running servers hold the hub's address; keeping it stable lets them reach
    the hub again after `gpulab up` restarts.
    """
    path = data_dir / "ports.json"
    ports = json.loads(path.read_text()) if path.exists() else {}
    wanted = ("hub_port", "proxy_api_port", "service_port", "mlflow_port")
    if all(name in ports for name in wanted):
        return ports
    # A data dir of an older gpulab lacks the later ones (the MLflow service's).
    ports.update({name: free_port() for name in wanted if name not in ports})
    path.write_text(json.dumps(ports))
    return ports


def _check_spec(spec: str) -> str:
    from gpulab.scheduler.inventory import InventoryError, parse_simulated

    try:
        parse_simulated(spec)
    except InventoryError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return spec


def help_all() -> str:
    """Every gpulab setting for <data-dir>/gpulab_config.py, with help, default and example.

    Only gpulab's own settings (see :mod:`.config_reference`); JupyterHub's are in
    ``jupyterhub --help-all``.
    """
    from .config_reference import as_config_file

    return as_config_file()


def up(args: argparse.Namespace) -> int:
    if args.help_all:
        print(help_all())
        return 0
    refused = single_account.refusal(os.geteuid() == 0, args.single_account)
    if refused:
        print(f"gpulab up: {refused}", file=sys.stderr)
        return 2
    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    # A hub killed without its shutdown leaves its service, culler and proxy running.
    end_leftovers(data_dir, shown_as=args.data_dir)
    settings = Settings(
        data_dir=data_dir,
        ip=args.ip,
        port=args.port,
        simulate_gpus=args.simulate_gpus or "",
        db_url=args.db_url or os.environ.get("GPULAB_DB_URL", ""),
        cull_idle_timeout=args.cull_idle_timeout,
        tls=args.tls or "",
        ssl_cert=os.path.abspath(args.ssl_cert) if args.ssl_cert else "",
        ssl_key=os.path.abspath(args.ssl_key) if args.ssl_key else "",
        **_internal_ports(data_dir),
    )
    try:
        trust = tls_banner(settings)
    except TLSError as e:
        print(f"gpulab up: {e}", file=sys.stderr)
        return 2
    gpus = gpus_line(settings.simulate_gpus)
    print(
        f"""
gpulab is starting at {settings.public_url}/
{login_banner(settings, args.demo)}
  API token of the admin (for automation): {data_dir / "admin-token"}
  GPUs: {gpus}
{trust}  Overrides: {data_dir / "gpulab_config.py"} (JupyterHub and c.GpuLabService settings)
""",
        flush=True,
    )
    env = {**os.environ, **settings.to_env(), DEMO_LOGIN_ENV: "1" if args.demo else "0"}
    # JupyterHub, stopping user servers before the gpulab service (hub_app.py).
    argv = [sys.executable, "-m", "gpulab.hub_ext.hub_app", "-f", str(HUB_CONFIG)]
    argv += args.hub_args
    os.chdir(data_dir)
    os.execvpe(argv[0], argv, env)
    return 0  # not reached


def service(args: argparse.Namespace) -> int:
    from gpulab.service.app import main

    main(args.rest)
    return 0


def agent(args: argparse.Namespace) -> int:
    from gpulab.telemetry.agent import main

    return main(args.rest)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpulab", description="gpulab: a GPU platform on JupyterHub")
    sub = p.add_subparsers(dest="command", required=True)
    u = sub.add_parser(
        "up",
        help="start the embedded platform (JupyterHub + gpulab) here",
        description="Start JupyterHub with gpulab in the foreground. "
        "Arguments after -- go to jupyterhub.",
    )
    u.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    u.add_argument("--port", type=int, default=8000, help="public port (default 8000)")
    u.add_argument(
        "--data-dir",
        default=".gpulab",
        help="where state, secrets and the database live (default .gpulab)",
    )
    u.add_argument(
        "--simulate-gpus",
        type=_check_spec,
        metavar="SPEC",
        help="declare GPUs on a machine without any, e.g. 2xA100-80GB or "
        "1xH200-141GB,4xT4-16GB (nothing is enforced)",
    )
    u.add_argument(
        "--db-url",
        help="SQLAlchemy URL for gpulab's database (default: SQLite in the data dir), "
        "e.g. postgresql://...; one with a password is better in the environment "
        "(GPULAB_DB_URL): a command line is every account's to read",
    )
    u.add_argument(
        "--cull-idle-timeout",
        type=int,
        default=3600,
        metavar="SECONDS",
        help="stop servers idle this long, freeing their slice (0: never)",
    )
    u.add_argument(
        "--demo",
        action="store_true",
        help="workshops: one shared password (in <data-dir>/user-password) logs in "
        "as any user name; default: per-user passwords with admin approval",
    )
    u.add_argument(
        "--single-account",
        action="store_true",
        help="without root: start anyway, every user's code running as this account "
        "(a one-person hub; users are not separated on this host, and the banner, "
        "spawn form and %%gpulab say so)",
    )
    u.add_argument(
        "--tls",
        choices=["self-signed"],
        help="serve https with a certificate from gpulab's own CA, kept in "
        "<data-dir>/tls/ca.pem (trust that file in your browser and clients); "
        "every hop inside is TLS too",
    )
    u.add_argument("--ssl-cert", metavar="FILE", help="serve https with this certificate (PEM)")
    u.add_argument("--ssl-key", metavar="FILE", help="the private key of --ssl-cert (PEM)")
    u.add_argument(
        "--help-all",
        action="store_true",
        help="list gpulab's settings for <data-dir>/gpulab_config.py, with "
        "their help and defaults, and exit",
    )
    u.add_argument("hub_args", nargs="*", help=argparse.SUPPRESS)
    u.set_defaults(func=up)
    s = sub.add_parser("service", help="run the gpulab service (the hub starts it)")
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(func=service)
    a = sub.add_parser("agent", help="run the node agent that pushes telemetry to the service")
    a.add_argument("rest", nargs=argparse.REMAINDER)
    a.set_defaults(func=agent)
    slurm_cli.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # `service` and `agent` pass every argument on, options included.
    if argv and argv[0] in ("service", "agent"):
        return {"service": service, "agent": agent}[argv[0]](argparse.Namespace(rest=argv[1:]))
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
