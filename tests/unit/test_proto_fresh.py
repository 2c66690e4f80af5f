"""The committed generated gRPC code must match proto/ exactly."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_matches_proto() -> None:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    fresh, stale = gen.is_fresh()
    assert fresh, f"services/v1 is stale for {stale}; run python scripts/gen_proto.py"
