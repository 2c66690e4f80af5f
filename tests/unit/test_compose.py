"""compose.yaml and docker/Dockerfile, checked statically (no Docker engine runs here).

Every service that runs the Frenzy image must start a real `frenzy` subcommand
with options that subcommand has (parsed by the real click command behind the
Typer app), every address must point at a service that listens there, every
service needs a health check, and Redis must persist with AOF.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE.get("services", {}) if isinstance(COMPOSE, dict) else {}

# Keys a compose service may have (the subset of the Compose spec worth allowing here): a typo
# such as `healtcheck:` would otherwise pass silently.
SERVICE_KEYS = {
    "image", "build", "command", "entrypoint", "environment", "env_file", "ports", "expose", "volumes",
    "depends_on", "healthcheck", "restart", "hostname", "container_name", "networks", "deploy", "user",
    "working_dir", "labels", "logging", "stop_grace_period", "stop_signal", "init", "ulimits", "profiles",
    "extra_hosts", "shm_size", "tmpfs", "cap_add", "cap_drop", "read_only", "pull_policy",
}
HEALTH_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval", "disable"}


def _argv(command: object) -> list[str]:
    if isinstance(command, str):
        return shlex.split(command)
    assert isinstance(command, list) and all(isinstance(a, str | int | float) for a in command), command
    return [str(a) for a in command]


def _uses_frenzy_image(svc: dict[str, Any]) -> bool:
    return "build" in svc or str(svc.get("image", "")).startswith("frenzy")


FRENZY_SERVICES = sorted(name for name, svc in SERVICES.items() if _uses_frenzy_image(svc))


# Typer vendors its own click (typer._click), so commands are recognised by shape, not by class:
# a group has a `commands` mapping, every command has `params` with `opts` and `make_context`.


def _is_group(cmd: Any) -> bool:
    return isinstance(getattr(cmd, "commands", None), dict)


def _cli() -> Any:
    from frenzy.cli.main import app

    group = typer.main.get_command(app)
    assert _is_group(group), "frenzy's CLI must be a command group"
    return group


def _resolve(group: Any, argv: list[str]) -> tuple[list[str], Any, list[str]]:
    """Walk subcommand words: -> (the words, the leaf command, its arguments)."""
    cmd = group
    words: list[str] = []
    rest = list(argv)
    while _is_group(cmd) and rest and not rest[0].startswith("-"):
        sub = cmd.commands.get(rest[0])
        assert sub is not None, (f"`frenzy {' '.join([*words, rest[0]])}` is not a frenzy command; "
                                 f"known: {sorted(cmd.commands)}")
        words.append(rest.pop(0))
        cmd = sub
    return words, cmd, rest


def _options(cmd: Any) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}


def _option_values(argv: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
                out[k] = v
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[a] = argv[i + 1]
    return out


def _listen_port(name: str) -> int | None:
    """The port a frenzy service listens on, from its --address / --port option."""
    values = _option_values(_argv(SERVICES[name].get("command", [])))
    if "--address" in values:
        return int(values["--address"].rsplit(":", 1)[1])
    if "--port" in values:
        return int(values["--port"])
    return None


# ---- shape ------------------------------------------------------------------------------------


def test_compose_parses_and_has_the_whole_stack() -> None:
    assert isinstance(COMPOSE, dict) and SERVICES, "compose.yaml must be a mapping with services"
    for name in ("redis", "predictor", "scheduler", "worker", "api"):
        assert name in SERVICES, f"service {name!r} missing"
    agents = [n for n in FRENZY_SERVICES if _argv(SERVICES[n]["command"])[0] == "agent"]
    assert len(agents) >= 2, "at least two fake-GPU agents"
    fakes = {_option_values(_argv(SERVICES[n]["command"]))["--fake-gpus"].split(":")[0] for n in agents}
    assert len(fakes) >= 2, f"agents should be heterogeneous, got {fakes}"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_keys_are_known_and_healthcheck_present(name: str) -> None:
    svc = SERVICES[name]
    unknown = set(svc) - SERVICE_KEYS
    assert not unknown, f"{name}: unknown keys {unknown} (typo?)"
    hc = svc.get("healthcheck")
    assert isinstance(hc, dict) and hc.get("test") and not hc.get("disable"), f"{name}: no healthcheck"
    assert set(hc) <= HEALTH_KEYS, f"{name}: unknown healthcheck keys {set(hc) - HEALTH_KEYS}"
    test = hc["test"]
    if isinstance(test, list):
        assert test[0] in ("CMD", "CMD-SHELL"), f"{name}: healthcheck test must start with CMD or CMD-SHELL"
        if test[0] == "CMD" and test[1:3] == ["python", "-c"]:
            compile(test[3], f"<{name} healthcheck>", "exec")  # the one-liner is valid Python


def test_redis_persists_with_aof() -> None:
    redis = SERVICES["redis"]
    assert str(redis["image"]).startswith("redis:7"), redis["image"]
    argv = _argv(redis.get("command", []))
    assert "--appendonly" in argv and argv[argv.index("--appendonly") + 1] == "yes", argv
    mounts = [str(v) for v in redis.get("volumes", [])]
    assert any(m.endswith(":/data") for m in mounts), "Redis' /data must be a volume"
    named = {m.split(":", 1)[0] for m in mounts}
    assert named <= set(COMPOSE.get("volumes") or {}), "Redis' volume must be declared under volumes:"
    assert _argv(redis["healthcheck"]["test"])[-2:] == ["redis-cli", "ping"] or "redis-cli" in str(
        redis["healthcheck"]["test"])


def test_build_contexts_and_dockerfiles_exist() -> None:
    built = [n for n, s in SERVICES.items() if "build" in s]
    assert built, "the frenzy services are built from the repository"
    for name in built:
        build = SERVICES[name]["build"]
        context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
        assert context.is_dir(), f"{name}: build context {context} missing"
        dockerfile = context / (build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile")
        assert dockerfile.is_file(), f"{name}: Dockerfile {dockerfile} missing"
        text = dockerfile.read_text()
        assert re.search(r"^FROM python:3\.11-slim\b", text, re.M), "one python:3.11-slim image"
        assert re.search(r'^ENTRYPOINT \["frenzy"\]', text, re.M), "the image's entrypoint is frenzy"
        for src in re.findall(r"^COPY (?!--from)(\S+) ", text, re.M):
            assert (context / src).exists(), f"{dockerfile}: COPY source {src} missing"


def test_depends_on_waits_for_healthy_services_without_cycles() -> None:
    graph: dict[str, list[str]] = {}
    for name, svc in SERVICES.items():
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict), f"{name}: depends_on must use the long form with conditions"
        for dep, cond in deps.items():
            assert dep in SERVICES, f"{name} depends on unknown service {dep!r}"
            assert cond.get("condition") == "service_healthy", f"{name} -> {dep}: condition service_healthy"
        graph[name] = list(deps)
    for name in FRENZY_SERVICES:
        if name != "predictor":
            assert graph[name], f"{name} must wait for what it needs"

    seen: dict[str, int] = {}

    def visit(n: str) -> None:
        assert seen.get(n) != 1, f"depends_on cycle through {n}"
        if seen.get(n) == 2:
            return
        seen[n] = 1
        for d in graph[n]:
            visit(d)
        seen[n] = 2

    for n in graph:
        visit(n)


# ---- commands against the real CLI -------------------------------------------------------------


@pytest.mark.parametrize("name", FRENZY_SERVICES)
def test_command_is_a_real_frenzy_subcommand_with_real_options(name: str) -> None:
    svc = SERVICES[name]
    assert "entrypoint" not in svc, f"{name}: keep the image's `frenzy` entrypoint"
    argv = _argv(svc.get("command"))
    assert argv and argv[0] != "frenzy", f"{name}: the entrypoint is already frenzy; command starts at the subcommand"
    words, leaf, rest = _resolve(_cli(), argv)
    assert words, f"{name}: no subcommand"
    assert not _is_group(leaf), f"{name}: `frenzy {' '.join(words)}` needs a subcommand"
    known = _options(leaf)
    for arg in rest:
        if arg.startswith("-"):
            opt = arg.split("=", 1)[0]
            assert opt in known, f"{name}: `frenzy {' '.join(words)}` has no option {opt}; it has {sorted(known)}"
    # The real parser accepts the whole command line (types, required options, arity).
    leaf.make_context(f"frenzy {' '.join(words)}", list(rest))


@pytest.mark.parametrize("name", FRENZY_SERVICES)
def test_addresses_point_at_services_that_listen_there(name: str) -> None:
    values = _option_values(_argv(SERVICES[name]["command"]))
    env = SERVICES[name].get("environment") or {}
    for opt in ("--scheduler", "--predictor"):
        if opt in values:
            host, port = values[opt].rsplit(":", 1)
            target = opt.removeprefix("--")
            assert host == target and host in SERVICES, f"{name}: {opt} {values[opt]} is not the {target} service"
            assert int(port) == _listen_port(target), f"{name}: {opt} port {port} != {target}'s listening port"
    for url in [values.get("--redis-url", ""), str(env.get("REDIS_URL", ""))]:
        if url:
            host = re.match(r"redis://([^:/]+)", url)
            assert host and host.group(1) in SERVICES, f"{name}: redis url {url} names no service"
    if "--address" in values:
        assert values["--address"].startswith("0.0.0.0:"), f"{name}: listen on every interface in a container"
        assert str(_listen_port(name)) in str(SERVICES[name]["healthcheck"]["test"]), \
            f"{name}: the healthcheck must probe the port the service listens on"


def test_agents_are_checked_by_their_own_heartbeat() -> None:
    for name in FRENZY_SERVICES:
        argv = _argv(SERVICES[name]["command"])
        if argv[0] != "agent":
            continue
        values = _option_values(argv)
        node, addr = values["--node"], values["--addr"]
        assert f"node_alive('{node}')" in str(SERVICES[name]["healthcheck"]["test"]), name
        assert addr in (name, SERVICES[name].get("hostname")), f"{name}: --addr must resolve to this container"


def test_worker_healthcheck_targets_the_celery_app() -> None:
    test = " ".join(_argv(SERVICES["worker"]["healthcheck"]["test"][1:]))
    m = re.search(r"celery -A (\S+)", test)
    assert m, test
    module, _, attr = m.group(1).partition(":")
    import importlib

    mod = importlib.import_module(module)
    assert hasattr(mod, attr or "app")
    assert "frenzy-worker@" in test  # the worker's --hostname in frenzy.worker.cli
