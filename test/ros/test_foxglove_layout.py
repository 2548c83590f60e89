"""config/foxglove_layout.json: a Foxglove layout (configById + a mosaic `layout` tree) that names
only topics the policy node has, and message paths that exist in their messages. The node's topics
are read from a running node (its publishers and subscriptions), not from a copy of their names."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest
import rclpy
from fake_decoder import FakeDecoder
from rclpy.parameter import Parameter

from heisd_ros.ros.node import PolicyNode

pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")

LAYOUT = Path(__file__).resolve().parents[2] / "config" / "foxglove_layout.json"
PANELS = {"Image", "Plot", "StateTransitions", "DiagnosticSummary", "DiagnosticStatusPanel", "RawMessages"}


@pytest.fixture(scope="module")
def node_topics() -> dict[str, type]:
    """Topic -> message class of everything the node (default parameters) publishes or subscribes to."""
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=86)
    node = PolicyNode(FakeDecoder, context=ctx, parameter_overrides=[Parameter("model_dir", value="fake")])
    try:
        ends = list(node.publishers) + list(node.subscriptions)
        return {e.topic_name: e.msg_type for e in ends if e.topic_name not in ("/rosout", "/parameter_events")}
    finally:
        node.destroy_node()
        rclpy.shutdown(context=ctx)


def _leaves(tree) -> list[str]:
    if isinstance(tree, str):
        return [tree]
    assert set(tree) >= {"first", "second", "direction"} and tree["direction"] in ("row", "column")
    return _leaves(tree["first"]) + _leaves(tree["second"])


def _references(layout: dict) -> list[tuple[str, str]]:
    """(panel id, message path or topic) of every topic reference in the layout."""
    refs = []
    for pid, cfg in layout["configById"].items():
        for key in ("topicToRender", "topicPath"):
            if key in cfg:
                refs.append((pid, cfg[key]))
        if "imageMode" in cfg:
            refs.append((pid, cfg["imageMode"]["imageTopic"]))
        refs += [(pid, p["value"]) for p in cfg.get("paths", [])]
    return refs


def _field_exists(cls: type, fields: list[str]) -> bool:
    """Whether a message path (`pose.position.x`, `delta_position[0]`) exists in the message class."""
    for name in fields:
        types = cls.get_fields_and_field_types()
        base = re.sub(r"\[\d+\]$", "", name)
        if base not in types:
            return False
        kind = types[base]
        if "/" in kind:
            pkg, typ = kind.split("/")
            cls = getattr(importlib.import_module(f"{pkg}.msg"), typ)
        elif name != base and not ("[" in kind or kind.startswith("sequence<")):
            return False
    return True


def test_layout_parses_and_names_only_the_nodes_topics(node_topics):
    layout = json.loads(LAYOUT.read_text())
    assert set(layout) >= {"configById", "globalVariables", "userNodes", "layout"}
    panels = layout["configById"]
    assert sorted(_leaves(layout["layout"])) == sorted(panels)
    assert {pid.split("!")[0] for pid in panels} <= PANELS
    for pid, cfg in panels.items():
        assert all(p.get("enabled", True) for p in cfg.get("paths", [])), pid
    refs = _references(layout)
    for pid, ref in refs:
        topic, _, rest = ref.partition(".")
        assert topic in node_topics, f"{pid}: {topic} is not a topic of the node ({sorted(node_topics)})"
        if rest:
            assert _field_exists(node_topics[topic], rest.split(".")), f"{pid}: {ref}"
    named = {r.partition(".")[0] for _, r in refs}
    # every camera view, the commands, the decode stats and the diagnostics are shown
    images = {t for t, cls in node_topics.items() if cls.__name__ == "Image"}
    assert images and images <= named
    assert {"/arm_command", "/decode_stats", "/diagnostics"} <= named
