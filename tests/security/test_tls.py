"""TLS on the gRPC servers, their clients and the API (issue 14, "TLS"): certificates from
`frenzy certs create`, a scheduler that speaks only TLS, mutual TLS for the predictor, the CLI and
the API reaching a TLS scheduler, and HTTPS on the API."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from frenzy.auth.roles import Role
from frenzy.cli.cmd_certs import make_certs
from frenzy.devstack.redis_server import free_port
from frenzy.predictor.server import serve as serve_predictor
from frenzy.rpc.auth import with_token
from frenzy.rpc.server import stop_server
from frenzy.rpc.tls import ClientTls, ServerTls, TlsConfigError, open_channel
from frenzy.scheduler.service import SchedulerServer
from frenzy.v1 import predictor_pb2, predictor_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from support.waiting import wait_for


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_certs(tmp_path_factory.mktemp("certs"), ["localhost", "127.0.0.1"], days=2)


@pytest.fixture
def tls_scheduler(redis_url: str, prefix: str, certs: dict[str, Path]) -> Iterator[tuple[SchedulerServer, str, int]]:
    """A scheduler serving TLS only, calling a predictor that demands a client certificate."""
    ptls = ServerTls.from_files(str(certs["server"]), str(certs["server_key"]), str(certs["ca"]))
    pserver, pport, phealth = serve_predictor("127.0.0.1:0", tls=ptls)
    sched = SchedulerServer(redis_url, f"127.0.0.1:{pport}", "127.0.0.1:0", prefix=prefix,
                            tls=ServerTls.from_files(str(certs["server"]), str(certs["server_key"])),
                            predictor_tls=ClientTls.from_files(str(certs["ca"]), str(certs["client"]),
                                                               str(certs["client_key"])))
    token, _ = sched.tokens.create("tls-admin", Role.ADMIN)
    try:
        yield sched, token, pport
    finally:
        sched.stop()
        stop_server(pserver, phealth, grace_s=0.5)


def _list_nodes(address: str, tls: ClientTls | None, token: str) -> list:
    with open_channel(address, tls) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(with_token(channel, token))
        return list(stub.ListNodes(scheduler_pb2.ListNodesRequest(), timeout=5).nodes)


def test_a_tls_scheduler_answers_only_clients_that_trust_its_ca(tls_scheduler, certs, tmp_path) -> None:
    sched, token, _ = tls_scheduler
    address = f"127.0.0.1:{sched.port}"
    assert _list_nodes(address, ClientTls.from_files(str(certs["ca"])), token) == []
    with pytest.raises(grpc.RpcError) as err:  # plaintext to a TLS port
        _list_nodes(address, None, token)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    other = make_certs(tmp_path / "other", ["127.0.0.1"], days=1)  # a CA the server was not issued by
    with pytest.raises(grpc.RpcError) as err:
        _list_nodes(address, ClientTls.from_files(str(other["ca"])), token)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_predictor_refuses_clients_without_a_certificate(tls_scheduler, certs) -> None:
    sched, _, predictor_port = tls_scheduler
    request = predictor_pb2.PredictRequest()
    request.model.catalog_name = "gpt2-124m"
    request.recipe.seq_len, request.recipe.global_batch, request.recipe.micro_batch = 512, 8, 1
    # the scheduler (with its client certificate) reaches the predictor ...
    assert predictor_pb2_grpc.PredictorStub(sched.channel).Predict(request, timeout=20).model_name
    # ... a client that trusts the CA but has no certificate of its own does not
    with open_channel(f"127.0.0.1:{predictor_port}", ClientTls.from_files(str(certs["ca"]))) as ch:
        with pytest.raises(grpc.RpcError) as err:
            predictor_pb2_grpc.PredictorStub(ch).Predict(request, timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_cli_and_api_reach_a_tls_scheduler_and_the_api_serves_https(tls_scheduler, certs) -> None:
    sched, token, _ = tls_scheduler
    address = f"127.0.0.1:{sched.port}"
    env = {**os.environ, "FRENZY_TOKEN": token, "FRENZY_TLS_CA": str(certs["ca"])}
    out = subprocess.run([sys.executable, "-m", "frenzy.cli.main", "nodes", "--scheduler", address, "--json"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    plain = subprocess.run([sys.executable, "-m", "frenzy.cli.main", "nodes", "--scheduler", address],
                           capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in env.items() if k != "FRENZY_TLS_CA"})
    assert plain.returncode != 0 and "UNAVAILABLE" in plain.stderr
    port = free_port()
    api = subprocess.Popen([sys.executable, "-m", "frenzy.cli.main", "api", "--host", "127.0.0.1", "--port",
                            str(port), "--scheduler", address, "--tls-cert", str(certs["server"]), "--tls-key",
                            str(certs["server_key"]), "--log-level", "warning"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"https://127.0.0.1:{port}"
        trust = ssl.create_default_context(cafile=str(certs["ca"]))

        def up() -> bool:
            assert api.poll() is None, "frenzy api exited"
            try:
                return httpx.get(f"{url}/healthz", verify=trust, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=30, what="the HTTPS API", interval=0.2)
        r = httpx.get(f"{url}/api/nodes", verify=trust, headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        with pytest.raises(httpx.HTTPError):  # plain HTTP to the HTTPS port
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=3).raise_for_status()
    finally:
        os.killpg(api.pid, signal.SIGTERM)
        api.wait(timeout=10)


def test_incomplete_tls_options_name_what_is_missing(certs, tmp_path) -> None:
    with pytest.raises(TlsConfigError, match="--tls-cert and --tls-key go together"):
        ServerTls.from_files(str(certs["server"]), None)
    with pytest.raises(TlsConfigError, match="--tls-ca needs"):
        ServerTls.from_files(None, None, str(certs["ca"]))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(TlsConfigError, match="not a PEM file"):
        ServerTls.from_files(str(tmp_path / "junk.pem"), str(certs["server_key"]))
    with pytest.raises(TlsConfigError, match="cannot read"):
        ClientTls.from_files(str(tmp_path / "missing.pem"))
    out = subprocess.run([sys.executable, "-m", "frenzy.cli.main", "scheduler", "--tls-cert", str(certs["server"])],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "go together" in out.stderr
