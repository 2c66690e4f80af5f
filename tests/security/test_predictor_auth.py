"""The predictor answers only the scheduler, and bounds each call's work (issue 34 item 8).

Before: `frenzy predictor` answered any caller that reached it (no token; only --tls-ca closed
it), and nothing bounded one call: three concurrent heavy calls made every user's submissions
15x slower. Attacked as an intruder on the network would: no token, a wrong token, a huge
request, a flood of concurrent calls; and `frenzy predictor` refuses to start open."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import marp
from frenzy.auth.roles import Role
from frenzy.devstack.redis_server import free_port
from frenzy.predictor import guard
from frenzy.predictor import server as predictor_server
from frenzy.predictor.server import serve as serve_predictor
from frenzy.rpc.auth import with_token
from frenzy.rpc.server import stop_server
from frenzy.scheduler.service import SchedulerServer
from frenzy.v1 import predictor_pb2, predictor_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2
from support.state import add_node, make_spec

FRENZY = [sys.executable, "-m", "frenzy.cli.main"]
TOKEN = guard.new_token()


def _request(**extra: object) -> predictor_pb2.PredictRequest:
    return predictor_pb2.PredictRequest(
        model=types_pb2.ModelSpec(catalog_name="gpt2-124m"),
        recipe=types_pb2.TrainingRecipe(seq_len=1024, global_batch=8, micro_batch=1, train_steps=10),
        pools=[types_pb2.GpuPool(gpu_type="L4", total_gpus=2, gpus_per_node=2)], **extra)  # type: ignore[arg-type]


def _predict(address: str, token: str | None, request: predictor_pb2.PredictRequest | None = None,
             ) -> predictor_pb2.PredictResponse:
    with grpc.insecure_channel(address) as raw:
        stub = predictor_pb2_grpc.PredictorStub(with_token(raw, token))
        return stub.Predict(request or _request(), timeout=30)


def _code(call: object) -> tuple[grpc.StatusCode, str]:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


@pytest.fixture(scope="module")
def predictor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `frenzy predictor` process, its token in a 0600 file, as compose and `frenzy up` run it."""
    path = tmp_path_factory.mktemp("predictor") / "predictor-token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, guard.TOKEN_FILE_ENV: str(path)}
    env.pop(guard.TOKEN_ENV, None)
    proc = subprocess.Popen([*FRENZY, "predictor", "--address", address], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line, deadline = "", time.monotonic() + 60
        while "listening" not in line and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stderr.readline()
        assert "listening" in line, f"the predictor did not start: {line}"
        yield address
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_call_without_the_token_is_unauthenticated(predictor: str) -> None:
    code, details = _code(lambda: _predict(predictor, None))
    assert code is grpc.StatusCode.UNAUTHENTICATED, (code, details)
    assert "no token" in details and "To fix:" in details


def test_a_wrong_token_is_unauthenticated(predictor: str) -> None:
    for wrong in (guard.new_token(), TOKEN[:-1], TOKEN + "x", "frz_someone_elses_api_token", "Bearer"):
        code, details = _code(lambda wrong=wrong: _predict(predictor, wrong))
        assert code is grpc.StatusCode.UNAUTHENTICATED, (wrong, code, details)
        assert "wrong token" in details or "no token" in details
    # another scheme than Bearer with the right secret is no token either
    with grpc.insecure_channel(predictor) as raw:
        stub = predictor_pb2_grpc.PredictorStub(raw)
        code, _ = _code(lambda: stub.Predict(_request(), metadata=[("authorization", f"Basic {TOKEN}")], timeout=10))
    assert code is grpc.StatusCode.UNAUTHENTICATED


def test_the_token_s_holder_gets_plans_and_health_stays_open(predictor: str) -> None:
    answer = _predict(predictor, TOKEN)
    assert answer.plans and answer.model_name
    with grpc.insecure_channel(predictor) as raw:
        status = health_pb2_grpc.HealthStub(raw).Check(health_pb2.HealthCheckRequest(), timeout=10).status
    assert status == health_pb2.HealthCheckResponse.SERVING


def test_a_huge_request_is_refused_before_marp_runs(predictor: str) -> None:
    """Even with the token: more pools, plans or bytes than one call may take -> RESOURCE_EXHAUSTED, at once."""
    types = [g.name for g in marp.list_gpus()]
    many = [types_pb2.GpuPool(gpu_type=f"{types[i % len(types)]}", total_gpus=1 << 20, gpus_per_node=8)
            for i in range(200)]
    huge = [
        _request(max_plans=1_000_000),
        predictor_pb2.PredictRequest(model=_request().model, recipe=_request().recipe, pools=many, mixed=True),
        predictor_pb2.PredictRequest(model=_request().model, recipe=_request().recipe,
                                     pools=[types_pb2.GpuPool(gpu_type="L4", total_gpus=8, gpus_per_node=8)] * 2),
        predictor_pb2.PredictRequest(model=types_pb2.ModelSpec(config_json="{" + " " * (3 << 20) + "}"),
                                     recipe=_request().recipe),
    ]
    for request in huge:
        started = time.monotonic()
        code, details = _code(lambda request=request: _predict(predictor, TOKEN, request))
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert "limit" in details or "twice" in details, details
        assert time.monotonic() - started < 5


def test_the_predictor_will_not_start_open(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (guard.TOKEN_ENV, guard.TOKEN_FILE_ENV)}
    done = subprocess.run([*FRENZY, "predictor", "--address", "127.0.0.1:0"], env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert "answer anyone" in done.stderr and "To fix:" in done.stderr
    # a token file other users may read is refused, as a join file is
    loose = tmp_path / "predictor-token"
    loose.write_text(TOKEN + "\n")
    loose.chmod(0o644)
    done = subprocess.run([*FRENZY, "predictor", "--address", "127.0.0.1:0", "--token-file", str(loose)], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "chmod 600" in done.stderr, done.stderr
    short = tmp_path / "short"
    short.write_text("abc\n")
    short.chmod(0o600)
    done = subprocess.run([*FRENZY, "predictor", "--address", "127.0.0.1:0", "--token-file", str(short)], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "not a predictor token" in done.stderr, done.stderr


def test_concurrent_calls_past_the_cap_wait_then_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """One slot: a second call waits ``wait_s`` for it, then RESOURCE_EXHAUSTED; the first is unharmed."""
    real = predictor_server.predict
    entered = threading.Event()

    def slow(request: predictor_pb2.PredictRequest) -> predictor_pb2.PredictResponse:
        entered.set()
        time.sleep(1.5)
        return real(request)

    monkeypatch.setattr(predictor_server, "predict", slow)
    server, port, health = serve_predictor("127.0.0.1:0", token=TOKEN,
                                           limits=guard.PredictLimits(max_concurrent=1, wait_s=0.3))
    try:
        results: list[tuple[grpc.StatusCode, str]] = []
        first = threading.Thread(target=lambda: results.append(_code(lambda: _predict(f"127.0.0.1:{port}", TOKEN))))
        first.start()
        assert entered.wait(10)
        code, details = _code(lambda: _predict(f"127.0.0.1:{port}", TOKEN))
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "busy" in details, (code, details)
        first.join(30)
        assert results == [(grpc.StatusCode.OK, "")]
    finally:
        stop_server(server, health, grace_s=0.5)


def test_the_scheduler_sends_the_token_and_submissions_work(redis_url: str, prefix: str, redis_client, keys) -> None:
    """A scheduler given the token plans through a predictor that demands it; one without it cannot."""
    add_node(redis_client, keys, "n0", "A100-80GB", 4)
    pserver, pport, phealth = serve_predictor("127.0.0.1:0", token=TOKEN)
    good = SchedulerServer(redis_url, f"127.0.0.1:{pport}", "127.0.0.1:0", prefix=prefix, predictor_token=TOKEN)
    bad = SchedulerServer(redis_url, f"127.0.0.1:{pport}", "127.0.0.1:0", prefix=prefix, serve="api")
    try:
        for sched, expect in ((good, grpc.StatusCode.OK), (bad, grpc.StatusCode.UNAVAILABLE)):
            token, _ = sched.tokens.create("alice", Role.SUBMIT)
            with grpc.insecure_channel(f"127.0.0.1:{sched.port}") as raw:
                stub = scheduler_pb2_grpc.SchedulerStub(with_token(raw, token))
                code, details = _code(lambda stub=stub: stub.SubmitJob(
                    scheduler_pb2.SubmitJobRequest(spec=make_spec("t")), timeout=30))
            assert code is expect, (code, details)
        assert "predictor unavailable" in details
    finally:
        good.stop()
        bad.stop()
        stop_server(pserver, phealth, grace_s=0.5)


def test_secrets_init_makes_a_private_token_the_predictor_accepts(tmp_path: Path) -> None:
    """compose's `init`: the token in a file (and a volume) of its own, 0600, kept on later starts."""
    from typer.testing import CliRunner

    from frenzy.cli.main import app

    path = tmp_path / "predictor" / "token"
    argv = ["secrets", "init", "--dir", str(tmp_path / "secrets"), "--predictor-token", str(path)]
    assert CliRunner().invoke(app, argv).exit_code == 0
    assert path.stat().st_mode & 0o777 == 0o600
    token = guard.read_token_file(path)
    assert token.startswith(guard.TOKEN_PREFIX)
    assert CliRunner().invoke(app, argv).exit_code == 0
    assert guard.read_token_file(path) == token  # kept: the running scheduler's copy still works
    assert not (tmp_path / "secrets" / "predictor-token").exists()
