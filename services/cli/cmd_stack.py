"""``frenzy up`` and ``frenzy demo``: the whole stack as local processes on this machine."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

from frenzy.cli import render
from frenzy.cli.output import fail

PANEL = "Local stack"


DEFAULT_API_PORT = 8080  # as Ray's dashboard is always 8265: a URL people can bookmark and a README can name


def up(
    cluster: Annotated[Path | None, typer.Option(help="Cluster file (default: examples/cluster.yaml if present).")] = None,
    api: Annotated[bool, typer.Option(help="Also serve the HTTP gateway and dashboard.")] = True,
    api_port: Annotated[int | None, typer.Option(
        envvar="FRENZY_API_PORT", min=0, max=65535, show_default=False,
        help=f"The dashboard's and REST API's port on 127.0.0.1 [default: {DEFAULT_API_PORT}, or a free port, "
             "said so, when another program holds it]; 0: any free port.")] = None,
    worker: Annotated[bool, typer.Option(help="Also run the Celery batch worker.")] = True,
    run_dir: Annotated[Path | None, typer.Option(help="Where logs go (default: ./var/run-<time>).")] = None,
) -> None:
    """Start the whole stack locally (Redis, predictor, scheduler, worker, API, fake-GPU agents) until Ctrl-C.

    It writes the credentials file (~/.config/frenzy/credentials.json, or FRENZY_CREDENTIALS):
    the scheduler's and the dashboard's addresses, an admin token and its Redis URLs, so
    `frenzy submit`, `jobs`, `batch`, `dashboard` and `token` in another shell need nothing else;
    it is removed when the stack stops. One
    stack per credentials file: while one answers, a second `frenzy up` is refused unless
    FRENZY_CREDENTIALS names another file.
    """
    from frenzy.auth.credentials import credentials_path
    from frenzy.signals import stop_on_signals

    where = credentials_path()
    _refuse_a_second_stack(where)
    redis_url = os.environ.get("REDIS_URL") or None
    if redis_url:
        _check_redis(redis_url)
    port = _api_port(api_port) if api else 0
    stack = _make_stack(cluster, run_dir, with_worker=worker, with_api=api, api_port=port)
    con = render.console()
    # Handlers first: a Ctrl-C at any moment must stop every child cleanly.
    stop = threading.Event()
    stop_on_signals(stop)
    try:
        stack.start(progress=lambda m: con.print(f"  [green]up[/] {m}"))
    except Exception as exc:  # noqa: BLE001 - report any start failure plainly
        fail(f"stack did not start: {exc}")
    wrote = False
    try:
        stack.write_credentials(where)
        wrote = True
        found = f"the CLI finds the scheduler and an admin token in {where} (mode 0600)"
    except OSError as exc:
        found = (f"could not write {where} ({exc.strerror}); use "
                 f"FRENZY_CREDENTIALS={stack.credentials_file}")
    dashboard = (f"dashboard and REST API: http://127.0.0.1:{stack.api_port}/ (log in: `frenzy dashboard`)\n"
                 if api else "")
    con.print(f"\n{found}: `frenzy jobs`, `frenzy submit ...`, `frenzy batch submit ...` and the operator "
              f"commands (`frenzy token create ...`, which find this stack's Redis there too) work as they are.\n"
              f"{dashboard}"
              f"logs in {stack.run_dir}. Ctrl-C stops everything.")
    try:
        while not stop.wait(1.0):
            stack.check_alive()
    except RuntimeError as exc:
        con.print(f"[red]{exc}[/]")
    finally:
        con.print("stopping ...")
        stack.stop()
        if wrote:
            _forget_credentials(where, stack.token)


def _refuse_a_second_stack(where: Path) -> None:
    """Two stacks writing one credentials file would leave the CLI talking to whichever wrote last,
    with the other's token refused: a second `frenzy up` is refused while the first answers."""
    from frenzy.auth.credentials import CredentialsError, read_credentials
    from frenzy.rpc.client import wait_healthy

    try:
        creds = read_credentials(where)
    except CredentialsError:
        return  # unreadable: it will be replaced, and the user told where it went
    if creds.scheduler and wait_healthy(creds.scheduler, timeout_s=1.0):
        fail(f"another stack is running: its scheduler answers on {creds.scheduler} and its credentials are in "
             f"{where}. To fix: stop it (Ctrl-C in its shell), or give this one its own credentials file: "
             f"FRENZY_CREDENTIALS=$HOME/.config/frenzy/second.json frenzy up (and the same variable for the "
             "commands that should use it)", 1)


def _check_redis(url: str) -> None:
    """REDIS_URL set but answering nothing is most often the export an earlier `frenzy up` printed,
    for a Redis that stopped with it: say so, rather than Redis' own 'Error 111'."""
    import redis

    from frenzy.auth.credentials import redact_url

    try:
        redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3).ping()
    except redis.AuthenticationError:
        fail(f"REDIS_URL={redact_url(url)} refused its credentials. To fix: correct the URL, or unset "
             "REDIS_URL and `frenzy up` starts a private Redis of its own", 1)
    except (redis.RedisError, ValueError) as exc:
        fail(f"REDIS_URL={redact_url(url)} is set but nothing answers there ({exc}); an earlier "
             "`frenzy up` prints such a URL for its own Redis, which stops with it. To fix: `unset REDIS_URL` "
             "and `frenzy up` starts a private Redis of its own, or start the Redis that URL names", 1)


def _api_port(asked: int | None) -> int:
    """The port the API will take: the one asked for (refused if taken), else 8080 when free, else
    any free port -- said, so the printed URL is the one to open."""
    import socket

    from frenzy.devstack.redis_server import free_port

    def free(port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True

    if asked == 0:
        return free_port()
    if asked is not None:
        if not free(asked):
            fail(f"--api-port {asked}: another program holds 127.0.0.1:{asked}. To fix: pick another port, or "
                 "--api-port 0 for any free one", 2)
        return asked
    if free(DEFAULT_API_PORT):
        return DEFAULT_API_PORT
    port = free_port()
    render.console(stderr=True).print(f"[yellow]note:[/] 127.0.0.1:{DEFAULT_API_PORT} is taken by another "
                                      f"program; the dashboard and REST API are on {port} instead")
    return port


def _forget_credentials(where: Path, token: str) -> None:
    """Remove the credentials file at exit if it is still this stack's: a file naming a stopped
    scheduler only makes the next command wait for a connection that never comes."""
    from frenzy.auth.credentials import CredentialsError, read_credentials

    try:
        if token and read_credentials(where).token == token:
            where.unlink(missing_ok=True)
    except (CredentialsError, OSError):
        pass


def _make_stack(cluster: Path | None, run_dir: Path | None, **kwargs: object):  # noqa: ANN202
    from frenzy.devstack.stack import LocalStack, load_cluster_file
    from has.cluster_spec import ClusterSpecError

    if cluster is None and Path("examples/cluster.yaml").exists():
        cluster = Path("examples/cluster.yaml")
    try:
        spec = load_cluster_file(str(cluster) if cluster else None)
    except ClusterSpecError as exc:
        fail(str(exc), 2)
    run = run_dir or Path("var") / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    return LocalStack.create(spec, run_dir=str(run), redis_url=os.environ.get("REDIS_URL") or None, **kwargs)


DEMO_SCRIPT = (
    "import os, sys, time\n"
    "print('argv', sys.argv[1:])\n"
    "print('frenzy demo job on', os.environ.get('FRENZY_GPU_TYPE'), 'GPUs', os.environ.get('CUDA_VISIBLE_DEVICES'))\n"
    "print('layout tp=%s pp=%s dp=%s zero=%s micro_batch=%s grad_accum=%s' % tuple(os.environ.get('FRENZY_' + k) "
    "for k in ('TP', 'PP', 'DP', 'ZERO_STAGE', 'MICRO_BATCH', 'GRAD_ACCUM')))\n"
    "print('rendezvous %s:%s node %s of %s' % (os.environ.get('MASTER_ADDR'), os.environ.get('MASTER_PORT'), "
    "os.environ.get('FRENZY_NODE_RANK'), os.environ.get('FRENZY_NNODES')))\n"
    "loss = 10.0\n"
    "for step in range(5):\n"
    "    loss *= 0.8\n"
    "    print(f'step {step} loss {loss:.3f}', flush=True)\n"
    "    time.sleep(0.1)\n"
)


def demo(
    cluster: Annotated[Path | None, typer.Option(help="Cluster file (default: examples/cluster.yaml).")] = None,
    model: Annotated[str, typer.Option(help="Model of the sample job.")] = "gpt2-355m",
    timeout_s: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 120.0,
    run_dir: Annotated[Path | None, typer.Option()] = None,
) -> None:
    """Bring the stack up on a private Redis with fake-GPU agents, run one job end to end, tear down.

    Exits 0 only if the job went PENDING -> ... -> SUCCEEDED and its GPUs were released afterwards.
    """
    import grpc

    stack = _make_stack(cluster, run_dir, with_worker=False, with_api=False)
    stack.redis_url = ""  # the demo always runs on its own private Redis
    con = render.console()
    con.rule("[bold]Frenzy demo")
    ok = False
    try:
        stack.start(progress=lambda m: con.print(f"  [green]up[/] {m}"))
        ok = _demo_job(stack, model, timeout_s)
    except (RuntimeError, grpc.RpcError) as exc:
        con.print(f"[red]demo failed:[/] {exc}")
    finally:
        stack.stop()
        con.print(f"stack stopped; logs in {stack.run_dir}")
    if not ok:
        raise typer.Exit(1)
    con.print("[bold green]demo passed[/]")


def _demo_job(stack, model: str, timeout_s: float) -> bool:  # noqa: ANN001
    from frenzy.cli.cmd_jobs import show_job
    from frenzy.rpc.client import scheduler_stub
    from frenzy.rpc.jobspec import parse_entry
    from frenzy.v1 import scheduler_pb2

    con = render.console()
    script = stack.run_dir / "demo_train.py"
    script.write_text(DEMO_SCRIPT)
    spec = parse_entry({"name": "demo", "model": model, "seq_len": 1024, "global_batch": 32, "micro_batch": 4,
                        "train_steps": 100, "command": [sys.executable, str(script), "--tp", "{tp}",
                                                        "--micro-batch", "{micro_batch}"]}).to_proto()
    with scheduler_stub(stack.scheduler_addr, token=stack.token) as stub:
        con.print(render.nodes_table(stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=10).nodes))
        resp = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=60)
        con.print(f"\nsubmitted [bold]{resp.job.id}[/] ({resp.job.model_name}, seq 1024, global batch 32) "
                  "over gRPC; following it:")
        deadline = time.monotonic() + timeout_s
        final = None
        for update in stub.WatchJob(scheduler_pb2.WatchJobRequest(job_id=resp.job.id), timeout=timeout_s):
            t = update.transition
            con.print(f"  {render.when(t.at)}  {render.styled_state(t.state):<12} {render.user_text(t.reason)}")
            final = update.job
            if time.monotonic() > deadline:
                break
        job = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=resp.job.id), timeout=10)
        con.print()
        show_job(job)
        for path in job.log_paths.values():
            if os.path.exists(path):
                con.rule(f"log {path}")
                con.print(Path(path).read_text(errors="replace").rstrip(), markup=False)
        del final
        nodes = stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=10).nodes
        held = [f"{n.name}:{g.index}" for n in nodes for g in n.gpus if g.owner]
        con.print(render.nodes_table(nodes))
        if render.state_name(job.state) != "SUCCEEDED":
            con.print(f"[red]job ended {render.state_name(job.state)}[/]")
            return False
        if held:
            con.print(f"[red]GPUs still held after the job: {held}[/]")
            return False
        con.print("all GPUs released")
        return True


def register(app: typer.Typer) -> None:
    app.command(rich_help_panel=PANEL)(up)
    app.command(rich_help_panel=PANEL)(demo)
