"""The API's documentation works on a cluster with no way out (issue 20): /docs (Swagger UI)
references only assets the gateway serves itself, every one of them loads, the Swagger UI
shipped is one that renders the OpenAPI 3.1 schema FastAPI writes (Swagger UI 4 and older show
"Unable to render this definition" for 3.1), and nothing on the page calls out (no validator
badge; no ReDoc page, whose logo comes from a CDN). No scheduler is needed: these pages never
call it. tests/e2e/test_dashboard_browser.py renders /docs in a real browser and fails on any
request that leaves the gateway."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest

with warnings.catch_warnings():  # starlette's "use httpx2" notice; httpx is what this project pins
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from frenzy.api.app import create_app
from frenzy.devstack.redis_server import free_port


class AssetRefs(HTMLParser):
    """Every URL a page makes the browser fetch: <script src>, <link href>, <img src>, and the
    spec URL ReDoc's <redoc spec-url> element reads."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str]] = []  # (tag, url)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for name in ("src", "href", "spec-url"):
            if a.get(name):
                self.refs.append((tag, a[name] or ""))


def refs_of(html: str) -> list[tuple[str, str]]:
    parser = AssetRefs()
    parser.feed(html)
    return parser.refs


def is_external(url: str) -> bool:
    """http(s)://host/..., or //host/... (protocol-relative): anything but this server's paths."""
    parts = urlsplit(url)
    return bool(parts.scheme or parts.netloc)


@pytest.fixture
def client() -> Iterator[TestClient]:
    # An address nothing listens on: the documentation must not depend on the scheduler.
    with TestClient(create_app(f"127.0.0.1:{free_port()}"), base_url="http://localhost") as c:
        yield c


def test_is_external_tells_local_from_remote() -> None:
    assert is_external("https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js")
    assert is_external("//fonts.googleapis.com/css?family=Roboto")
    assert not is_external("/static-offline-docs/swagger-ui.css")
    assert not is_external("./swagger-ui.css")


def test_docs_page_references_only_local_assets_and_each_loads(client: TestClient) -> None:
    page = "/docs"
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    refs = refs_of(r.text)
    scripts = [u for t, u in refs if t == "script"]
    styles = [u for t, u in refs if t == "link"]
    assert scripts, f"{page} loads no script: {r.text[:500]}"
    external = [u for _, u in refs if is_external(u)]
    assert external == [], f"{page} still loads assets from outside the cluster: {external}"
    # Inline scripts or styles must not reach out either (an @import, a fetch of a CDN URL).
    assert not re.search(r"https?://", r.text), f"{page} names an external URL: {r.text}"
    for _, url in refs:
        asset = client.get(url)
        assert asset.status_code == 200, f"{page}: {url} -> {asset.status_code}"
        if url.endswith(".js"):
            assert "javascript" in asset.headers["content-type"] and len(asset.content) > 100_000, url
        elif url.endswith(".css"):
            assert asset.headers["content-type"].startswith("text/css") and len(asset.content) > 10_000, url
    assert any(u.endswith("swagger-ui-bundle.js") for u in scripts)
    assert any(u.endswith("swagger-ui.css") for u in styles)


def test_docs_page_calls_nothing_outside(client: TestClient) -> None:
    """Swagger UI's validator badge sends the schema's URL to validator.swagger.io for any
    non-loopback host unless validatorUrl is null; ReDoc 2.5 always fetches its logo from
    cdn.redoc.ly, so /redoc is not served."""
    html = client.get("/docs").text
    assert re.search(r'"validatorUrl"\s*:\s*null', html), html
    assert client.get("/redoc").status_code == 404


def test_shipped_swagger_ui_renders_the_openapi_version_fastapi_writes(client: TestClient) -> None:
    schema_version = client.get("/openapi.json").json()["openapi"]
    bundle_url = next(u for t, u in refs_of(client.get("/docs").text) if t == "script" and u.endswith(".js"))
    bundle = client.get(bundle_url).text
    found = re.search(r'PACKAGE_VERSION:"(\d+)\.(\d+)\.(\d+)"', bundle)
    assert found, "cannot read the Swagger UI version from the shipped bundle"
    major = int(found.group(1))
    # OpenAPI 3.1 rendering came with Swagger UI 5.0 (swagger-ui release notes, v5.0.0).
    if schema_version.startswith("3.1"):
        assert major >= 5, f"Swagger UI {found.group(0)} cannot render OpenAPI {schema_version}"


def test_docs_pages_pass_the_host_check(client: TestClient) -> None:
    """The guard covers the documentation too: a DNS-rebinding page gets nothing from here."""
    r = client.get("/docs", headers={"host": "evil.example"})
    assert r.status_code == 421
    r = client.get("/static-offline-docs/swagger-ui.css", headers={"host": "evil.example"})
    assert r.status_code == 421
