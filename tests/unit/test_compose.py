"""compose.yaml and docker/Dockerfile, checked statically (no Docker engine runs here).

Every service that runs the Frenzy image must start a real `frenzy` subcommand
with options that subcommand has (parsed by the real click command behind the
Typer app), every address must point at a service that listens there, every
long-running service needs a health check, and Redis must persist with AOF.

And nothing is open (issue 14): no port is published beyond loopback, Redis is not
published and lets in only a password it reads from a file that a one-shot service
generates, no secret is written in compose.yaml, every Redis client gets the password
through REDIS_URL_FILE -- each its own role's least-privilege user, agents their node's, the
operator's (admin) URL only for the one-shot administration -- and only the batch worker holds a
token (agents none).
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


def _one_shot(svc: dict[str, Any]) -> bool:
    """A service that runs once to completion (compose's `restart: "no"`), e.g. making secrets."""
    return str(svc.get("restart", "")).lower() in ("no", "false")


ONE_SHOT = sorted(name for name, svc in SERVICES.items() if _one_shot(svc))
LONG_RUNNING = sorted(name for name in SERVICES if name not in ONE_SHOT)
# Services that wait for nothing: the predictor is pure computation; `init` makes what others need.
NEEDS_NOTHING = {"predictor", "init"}


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
    if name in ONE_SHOT:
        assert _uses_frenzy_image(svc) and "healthcheck" not in svc, \
            f"{name}: a one-shot runs a frenzy command to completion; others wait for it to finish"
        return
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
            wanted = "service_completed_successfully" if dep in ONE_SHOT else "service_healthy"
            assert cond.get("condition") == wanted, f"{name} -> {dep}: condition {wanted}"
        graph[name] = list(deps)
    for name in FRENZY_SERVICES:
        if name not in NEEDS_NOTHING:
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
    assert "--redis-url" not in values and "REDIS_URL" not in env, \
        f"{name}: Redis' URL carries its password; give the service REDIS_URL_FILE instead"
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


# ---- nothing is open (issue 14) ----------------------------------------------------------------

LOOPBACK = {"127.0.0.1", "::1", "localhost"}
# Environment names that would hand a service a credential in compose.yaml itself.
CREDENTIAL_ENV = {"REDIS_URL", "FRENZY_TOKEN", "FRENZY_CREDENTIALS", "REDIS_PASSWORD"}


def _mounts(svc: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read-only) of each of a service's volumes, short or long syntax."""
    out = []
    for v in svc.get("volumes") or []:
        if isinstance(v, dict):
            out.append((str(v.get("source", "")), str(v["target"]), bool(v.get("read_only"))))
        else:
            parts = str(v).split(":")
            out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def _volume_at(svc: dict[str, Any], path: str) -> tuple[str, str, bool] | None:
    """The mount holding ``path`` in a service, if any."""
    for source, target, ro in _mounts(svc):
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return source, target, ro
    return None


def _params(name: str) -> dict[str, Any]:
    """A frenzy service's options as its real command parses them (defaults included)."""
    words, leaf, rest = _resolve(_cli(), _argv(SERVICES[name]["command"]))
    return leaf.make_context(f"frenzy {' '.join(words)}", list(rest)).params


def _runs(name: str, *words: str) -> bool:
    return name in FRENZY_SERVICES and _argv(SERVICES[name]["command"])[:len(words)] == list(words)


def _the_service_running(*words: str) -> str:
    found = [n for n in FRENZY_SERVICES if _runs(n, *words)]
    assert len(found) == 1, f"exactly one service must run `frenzy {' '.join(words)}`, found {found}"
    return found[0]


def _host_ip(port: object) -> str | None:
    """The host address a `ports:` entry publishes on; None when it publishes on every interface."""
    if isinstance(port, dict):
        return port.get("host_ip")
    text = str(port).split("/", 1)[0]
    if text.startswith("["):
        return text[1:text.index("]")]
    parts = text.split(":")
    return parts[0] if len(parts) == 3 else None


def _talks_to_redis(name: str) -> bool:
    """The service's frenzy command has a --redis-url option (its state or broker is Redis)."""
    _, leaf, _ = _resolve(_cli(), _argv(SERVICES[name]["command"]))
    return "--redis-url" in _options(leaf)


def test_host_ip_parsing() -> None:
    assert _host_ip("8080:8080") is None and _host_ip("8080") is None and _host_ip("0.0.0.0:1:1") == "0.0.0.0"
    assert _host_ip("127.0.0.1:8080:8080/tcp") == "127.0.0.1" and _host_ip("[::1]:1:1") == "::1"
    assert _host_ip({"target": 1, "published": 1}) is None and _host_ip({"host_ip": "::1"}) == "::1"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_published_only_on_loopback(name: str) -> None:
    for port in SERVICES[name].get("ports") or []:
        assert _host_ip(port) in LOOPBACK, (
            f"{name}: port {port!r} is published on every interface; publish it on loopback only, e.g. "
            f"\"127.0.0.1:{str(port).split(':')[-1]}\" (a TLS proxy serves other hosts)")
    assert SERVICES[name].get("network_mode") != "host", f"{name}: host networking bypasses all of this"


def test_redis_is_not_published_and_lets_in_only_a_password() -> None:
    redis = SERVICES["redis"]
    assert not redis.get("ports"), "Redis must be reachable only on the compose network: no ports"
    argv = _argv(redis["command"])
    assert "--requirepass" not in argv, "a password on Redis' command line is written in compose.yaml"
    assert "--aclfile" in argv, "Redis needs an ACL file (default user off, a user with a password)"
    acl = argv[argv.index("--aclfile") + 1]
    mount = _volume_at(redis, acl)
    assert mount and mount[2], f"Redis' ACL file {acl} must come from a volume mounted read-only"
    assert mount[0] in (COMPOSE.get("volumes") or {}), f"{mount[0]} must be a named volume"

    from frenzy.cli.cmd_secrets import ACL_FILE, acl_text, role_users

    init = _the_service_running("secrets", "init")
    directory = str(_params(init)["directory"])
    assert acl == f"{directory}/{ACL_FILE}", f"Redis reads {acl}; `{init}` writes {directory}/{ACL_FILE}"
    assert _volume_at(SERVICES[init], directory) == (mount[0], directory, False), \
        f"`{init}` must write its --dir into the volume Redis reads"
    assert "init" in (redis.get("depends_on") or {}), "Redis starts once its ACL file is made"
    # What init writes: no user with rights without a password (the health user may only PING).
    users = role_users("frenzy", _params(init)["node"] or [])
    for line in acl_text([(u, "pw") for u in users]).splitlines():
        user, *rules = line.split()[1:]
        if user == "default":  # locked behind the hash of a password nobody has (redis/redis#14541)
            assert "nopass" not in rules and not any(r.startswith(">") for r in rules), line
            assert any(r.startswith("#") and len(r) == 65 for r in rules), line
        if "nopass" in rules:
            assert [r for r in rules if r.startswith(("+", "-", "~", "%"))] == ["-@all", "+ping"], line
    health = str(redis["healthcheck"]["test"])
    assert "--user health" in health and "PONG" in health, "the health check PINGs as the PING-only user"


def test_no_secret_is_written_in_compose() -> None:
    text = COMPOSE_FILE.read_text()
    assert not re.search(r"redis://[^\s\"']*@", text), "a Redis URL with a password in compose.yaml"
    assert "requirepass" not in text and "frz_" not in text, "a password or a token in compose.yaml"
    for name, svc in SERVICES.items():
        env = svc.get("environment") or {}
        assert isinstance(env, dict), f"{name}: environment as a mapping, so it can be checked"
        for key, value in env.items():
            assert key not in CREDENTIAL_ENV and not re.search("PASSWORD|SECRET", key), \
                f"{name}: {key} in the environment is a credential in compose.yaml; use a *_FILE variable"
            assert "@" not in str(value), f"{name}: {key}={value} looks like it carries a credential"
        assert "env_file" not in svc, f"{name}: env_file would put credentials in the environment"


@pytest.mark.parametrize("name", FRENZY_SERVICES)
def test_redis_clients_get_the_url_from_the_file_init_writes(name: str) -> None:
    from frenzy.cli.cmd_secrets import role_users, url_file

    env = SERVICES[name].get("environment") or {}
    init = _the_service_running("secrets", "init")
    directory = str(_params(init)["directory"])
    secrets_volume = _volume_at(SERVICES[init], directory)[0]  # type: ignore[index]
    mount = _volume_at(SERVICES[name], directory)
    if name == init:
        return
    if not _talks_to_redis(name):
        assert "REDIS_URL_FILE" not in env and mount is None, \
            f"{name} does not use Redis: it gets neither its password nor the volume holding it"
        return
    role, node = _redis_role(name)
    wanted = url_file(role, node)
    made = {u.url_file for u in role_users("frenzy", _params(init)["node"] or [])}
    assert wanted in made, f"`{init}` makes no {wanted} for {name}: add its node with --node"
    assert env.get("REDIS_URL_FILE") == f"{directory}/{wanted}", \
        f"{name} talks to Redis as {role.value}: REDIS_URL_FILE={directory}/{wanted} (its own role's user)"
    assert mount == (secrets_volume, directory, True), \
        f"{name}: mount the {secrets_volume} volume read-only at {directory}"
    assert (SERVICES[name].get("depends_on") or {}).get("redis"), f"{name} must wait for Redis"
    health = str(SERVICES[name].get("healthcheck", {}).get("test", ""))
    if "redis" in health.lower():
        assert "REDIS_URL_FILE" in health, f"{name}: a health check that reads Redis needs its credentials"
    # The URL init writes names the Redis service and the port Redis listens on.
    params = _params(init)
    assert params["redis_host"] == "redis" and params["redis_port"] == 6379


def _redis_role(name: str) -> tuple[Any, str | None]:
    """The Redis role (``frenzy.state.acl.RedisRole``) a frenzy service acts in, and its node for
    an agent: the one-shot administration (tokens, node keys) is the operator's."""
    from frenzy.state.acl import RedisRole

    argv = _argv(SERVICES[name]["command"])
    if argv[0] == "agent":
        return RedisRole.AGENT, _option_values(argv)["--node"]
    if argv[0] in ("scheduler", "worker"):
        return RedisRole(argv[0]), None
    return RedisRole.OPERATOR, None


def test_only_the_one_shot_administration_reads_the_operator_url() -> None:
    """The operator's user is the admin of Frenzy's keys: no long-running service may hold it."""
    from frenzy.cli.cmd_secrets import URL_FILE

    directory = str(_params(_the_service_running("secrets", "init"))["directory"])
    readers = sorted(n for n, s in SERVICES.items()
                     if (s.get("environment") or {}).get("REDIS_URL_FILE") == f"{directory}/{URL_FILE}")
    assert readers == sorted({_the_service_running("secrets", "tokens"), _the_service_running("node", "key", "create")}), \
        f"only bootstrap and node-keys may read the operator's URL; read by {readers}"
    assert all(n in ONE_SHOT for n in readers), readers
    for name in FRENZY_SERVICES:
        health = str(SERVICES[name].get("healthcheck", {}).get("test", ""))
        assert directory not in health, f"{name}: its health check must use its own role's URL (REDIS_URL_FILE)"


def test_every_agent_has_its_own_redis_user_and_init_makes_only_those() -> None:
    from frenzy.state.acl import RedisRole, role_rules
    from frenzy.state.keys import Keys

    init = _the_service_running("secrets", "init")
    nodes = _params(init)["node"] or []
    agents = {_redis_role(n)[1]: n for n in FRENZY_SERVICES if _runs(n, "agent")}
    assert sorted(nodes) == sorted(agents), f"`{init}` --node {nodes} must be exactly the agents' nodes {sorted(agents)}"
    for node, name in agents.items():
        env = SERVICES[name].get("environment") or {}
        assert env["REDIS_URL_FILE"].endswith(f"-agent-{node}"), f"{name} must read node {node}'s URL"
        # Its health check runs EXISTS on its own lease: within the agent user's keys and commands.
        rules = role_rules(RedisRole.AGENT, "frenzy", node, selectors=True)
        assert "+exists" in rules and f"~{Keys().node_alive(node)}" in rules, rules
    prefixes = {(SERVICES[n].get("environment") or {}).get("FRENZY_PREFIX") for n in FRENZY_SERVICES}
    assert prefixes == {"frenzy"}, f"the ACL's key patterns are made for prefix frenzy; services use {prefixes}"


def test_init_service_uses_the_url_host_of_the_redis_service() -> None:
    redis_argv = _argv(SERVICES["redis"]["command"])
    assert "--port" not in redis_argv, "Redis listens on 6379, the port `secrets init` writes in the URL"


def test_only_the_worker_holds_a_token_and_agents_none() -> None:
    from frenzy.cli.cmd_secrets import ADMIN_TOKEN_FILE, WORKER_TOKEN_FILE

    bootstrap = _the_service_running("secrets", "tokens")
    directory = str(_params(bootstrap)["directory"])
    tokens_volume, _, ro = _volume_at(SERVICES[bootstrap], directory) or ("", "", True)
    assert tokens_volume and not ro, f"`{bootstrap}` writes its tokens into a volume"
    assert SERVICES[bootstrap]["depends_on"]["redis"]["condition"] == "service_healthy"
    holders = sorted(n for n, s in SERVICES.items() if any(src == tokens_volume for src, _, _ in _mounts(s)))
    assert holders == sorted({bootstrap, "worker"}), f"only the worker may read the tokens; mounted in {holders}"
    worker = SERVICES["worker"]
    assert (worker.get("environment") or {}).get("FRENZY_TOKEN_FILE") == f"{directory}/{WORKER_TOKEN_FILE}"
    assert _volume_at(worker, directory) == (tokens_volume, directory, True)
    assert worker["depends_on"][bootstrap]["condition"] == "service_completed_successfully"
    for name in FRENZY_SERVICES:
        env = SERVICES[name].get("environment") or {}
        # (the predictor token is no user's: the scheduler's secret to the predictor, issue 34)
        tokens_in_env = [k for k in env if "TOKEN" in k.upper() and k != "FRENZY_PREDICTOR_TOKEN_FILE"]
        if _runs(name, "agent"):
            assert not tokens_in_env, f"{name}: an agent runs jobs; it holds no token ({tokens_in_env})"
        elif name != "worker":
            assert not tokens_in_env, f"{name}: no token for users in a service's environment"
    # The header says where the admin token is, and the service it names can read it.
    header = "".join(line for line in COMPOSE_FILE.read_text().splitlines(True) if line.startswith("#"))
    m = re.search(r"docker compose exec -T (\S+) cat (\S+)\)", header)
    assert m and m.group(2) == f"{directory}/{ADMIN_TOKEN_FILE}", "the header shows how to read the admin token"
    assert _volume_at(SERVICES[m.group(1)], m.group(2)), f"{m.group(1)} cannot read {m.group(2)}"


def test_dockerfile_makes_the_volume_dirs_the_frenzy_user_writes() -> None:
    # An empty named volume takes the owner and mode of the image's directory: without these the
    # frenzy user (uid 10001) could not write its secrets, tokens or logs.
    text = (ROOT / "docker" / "Dockerfile").read_text()
    mkdir = " ".join(re.findall(r"mkdir -p ([^&\n]+)", text)).split()
    chown = " ".join(re.findall(r"chown frenzy ([^&\n]+)", text)).split()
    for name in FRENZY_SERVICES:
        for source, target, ro in _mounts(SERVICES[name]):
            if source in (COMPOSE.get("volumes") or {}) and not ro:
                assert target in mkdir and target in chown, f"Dockerfile: mkdir and chown frenzy {target}"
