"""Property-based fuzzing of the cluster file parser (issue 14): whatever YAML or JSON decodes to,
``parse_cluster`` ends in a ClusterSpec whose every value is in range, or a ClusterSpecError naming
the entry and field, quickly; never another exception. YAML gives keys that are not strings, and
NaN and infinities (``.nan``, ``.inf``), so the values here include them."""

from __future__ import annotations

import math
import re

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from has.cluster_spec import ClusterSpec, ClusterSpecError, parse_cluster

SETTINGS = settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)
FIELDS = ["gpu", "count", "gpus_per_node", "name_prefix", "intra_node_link", "inter_node_gbps"]

scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=16)
           | st.sampled_from([0, -1, 2**63, 10**30, math.nan, math.inf, -math.inf, "", " ", "A100-80GB", "L4",
                              10**400, "nvlink", "pcie", "a100", "-x", "a/b", "..", "\x00"]))
keys = st.one_of(st.sampled_from([*FIELDS, "nodes"]), st.text(max_size=8), st.integers(), st.booleans(),
                 st.none(), st.floats(allow_nan=False))
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=20,
)
GOOD = {"gpu": "A100-80GB", "count": 2, "gpus_per_node": 8, "name_prefix": "a100", "intra_node_link": "nvlink",
        "inter_node_gbps": 25.0}
entries = st.builds(lambda over, drop: {k: v for k, v in {**GOOD, **over}.items() if k not in drop},
                    st.dictionaries(keys, values, max_size=3), st.sets(st.sampled_from(FIELDS), max_size=2))
documents = st.one_of(
    values,
    st.builds(lambda e: {"nodes": e}, values),
    st.builds(lambda es: {"nodes": es}, st.lists(entries | values, min_size=1, max_size=4)),
)


def _check(data: object) -> None:
    try:
        spec = parse_cluster(data)
    except ClusterSpecError as exc:
        assert re.match(r"(cluster file|nodes)", str(exc)), exc  # names the entry and field
        return
    assert isinstance(spec, ClusterSpec) and spec.groups
    prefixes = [g.name_prefix for g in spec.groups]
    assert len(set(prefixes)) == len(prefixes)
    for g in spec.groups:
        assert isinstance(g.gpu, str) and g.gpu
        assert type(g.count) is int and g.count >= 1 and type(g.gpus_per_node) is int and g.gpus_per_node >= 1
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", g.name_prefix)
        assert g.intra_node_link in (None, "nvlink", "pcie")
        assert g.inter_node_gbps is None or (math.isfinite(g.inter_node_gbps) and g.inter_node_gbps > 0)
    assert spec.total_gpus >= 1


@SETTINGS
@given(documents)
@example({"nodes": [{"gpu": "L4", 1: "x", "zz": 2}]})  # unknown keys that do not sort together (YAML)
@example({"nodes": [{"gpu": "L4", "inter_node_gbps": math.nan}]})  # `.nan` passed `<= 0`
@example({"nodes": [{"gpu": "L4", "inter_node_gbps": math.inf}]})
@example({"nodes": [{"gpu": "L4", "intra_node_link": ["nvlink"]}]})
@example({"nodes": [{"gpu": "L4", "inter_node_gbps": 10**400}]})  # float() of it overflowed
def test_any_document_is_a_cluster_or_a_cluster_spec_error(data: object) -> None:
    _check(data)


YAML_TOKENS = st.sampled_from([
    "nodes:", "\n", "  ", "- ", ": ", "{", "}", "[", "]", ", ", "gpu", "count", "gpus_per_node", "name_prefix",
    "intra_node_link", "inter_node_gbps", "A100-80GB", "L4", "2", "-1", ".nan", ".inf", "-.inf", "1e999", "~",
    "nvlink", "pcie", "1: x", "? [a]", "&a ", "*a", "true", "0x10", "2024-01-01",
])


@settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.lists(YAML_TOKENS, max_size=40).map("".join))
def test_yaml_text(text: str) -> None:
    # What `frenzy up --cluster` and `frenzy simulate` do: safe_load, then parse_cluster.
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, TypeError, RecursionError):
        return  # the loader's own errors, which the callers turn into ClusterSpecError
    _check(data)
