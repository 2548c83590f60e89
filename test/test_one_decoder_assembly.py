"""One decoder assembly: HybridDecoders are built by `heisd_ros.assembly.assemble_decoders` only,
and the model names "tiny" and "auto" are resolved by `heisd_ros.policy` only.

The source is read, not run: a tool or benchmark that builds its decoder by hand (and so may hand a
method a part it should not have, or miss one) fails here, naming the file and line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ASSEMBLY = REPO / "heisd_ros" / "assembly.py"
ENGINE = REPO / "heisd_ros" / "core" / "engine.py"
POLICY = REPO / "heisd_ros" / "policy.py"
MAGIC_MODEL_NAMES = {"tiny", "auto"}
MAGIC_MODEL_CONSTANTS = {"TINY_MODEL", "AUTO_MODEL"}


def sources() -> list[Path]:
    """Every Python file of the node package, the workbench and benchmarks/."""
    return sorted(p for d in ("heisd_ros", "heisd_libero", "benchmarks") for p in (REPO / d).rglob("*.py"))


def decoder_constructions(tree: ast.AST) -> list[int]:
    """Lines that call HybridDecoder, by name, under an alias or as a module attribute."""
    names = {"HybridDecoder"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names |= {a.asname for a in node.names if a.name == "HybridDecoder" and a.asname}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id in names) or (isinstance(f, ast.Attribute) and f.attr == "HybridDecoder"):
                lines.append(node.lineno)
    return lines


def _names_magic(node: ast.AST) -> bool:
    """A literal "tiny" or "auto" or policy.py's constant of one, alone or in a tuple, list or set."""
    if isinstance(node, ast.Constant):
        return node.value in MAGIC_MODEL_NAMES
    if isinstance(node, (ast.Name, ast.Attribute)):
        return (node.id if isinstance(node, ast.Name) else node.attr) in MAGIC_MODEL_CONSTANTS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_magic(e) for e in node.elts)
    return False


def magic_model_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing something named like a model (`model_dir`, `args.model`) with "tiny"/"auto";
    other settings with an 'auto' value (the scene, the LLM kernel) are no model names."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(_names_magic(x) for x in [node.left, *node.comparators]):
            operands = [x for x in [node.left, *node.comparators] if not _names_magic(x)]
            if any("model" in ast.unparse(x).lower() for x in operands):
                lines.append(node.lineno)
    return lines


def _found(finder, allowed: set[Path]) -> list[str]:
    found = []
    for path in sources():
        if path in allowed:
            continue
        for line in finder(ast.parse(path.read_text(), str(path))):
            found.append(f"{path.relative_to(REPO)}:{line}")
    return found


def test_no_decoder_is_built_outside_the_assembly() -> None:
    assert decoder_constructions(ast.parse(ASSEMBLY.read_text())), "the assembly itself builds HybridDecoders"
    assert _found(decoder_constructions, {ASSEMBLY, ENGINE}) == [], \
        "HybridDecoder built outside heisd_ros/assembly.py (use assemble_decoders, or policy.build_decoders)"


def test_magic_model_names_are_resolved_in_policy_only() -> None:
    from heisd_ros import policy

    assert (policy.TINY_MODEL, policy.AUTO_MODEL) == ("tiny", "auto")
    assert magic_model_comparisons(ast.parse(POLICY.read_text())), "heisd_ros/policy.py resolves them"
    assert _found(magic_model_comparisons, {POLICY}) == [], \
        "a model name 'tiny'/'auto' compared outside heisd_ros/policy.py (use resolve_paths, choose_auto, is_tiny)"


@pytest.mark.parametrize("code, found", [
    ("HybridDecoder(vla, cfg)", True), ("engine.HybridDecoder(vla, cfg)", True),
    ("from heisd_ros.core.engine import HybridDecoder as D\nD(vla, cfg)", True),
    ("x: HybridDecoder = build()", False), ('"""HybridDecoder(vla, cfg)"""', False),
])
def test_the_construction_finder(code: str, found: bool) -> None:
    assert bool(decoder_constructions(ast.parse(code))) is found


@pytest.mark.parametrize("code, found", [
    ('cfg.model_dir == "tiny"', True), ('args.model != "auto"', True), ('model_dir in ("tiny", "x")', True),
    ('"tiny" == self.model_dir', True), ('cfg.scene == "auto"', False), ('llm_linear in ("onednn", "auto")', False),
    ('cfg.model_dir == "models/x"', False), ("paths.model_dir != TINY_MODEL", True),
    ("model_dir == policy.AUTO_MODEL", True),
])
def test_the_comparison_finder(code: str, found: bool) -> None:
    assert bool(magic_model_comparisons(ast.parse(code))) is found


def test_assembled_decoders_share_the_parts_and_get_only_what_their_method_uses() -> None:
    from heisd_ros.assembly import PolicyParts, assemble_decoders
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.drafter import EagleDrafter
    from heisd_ros.core.errors import ConfigError
    from heisd_ros.models.loader import tiny_vla

    vla = tiny_vla(seed=0)
    drafter, shared, timed = EagleDrafter(vla.language_model.config), object(), object()
    configs = {m: DecoderConfig(method=m) for m in ("ar", "drafter", "heisd")}
    decs = assemble_decoders(PolicyParts(vla, None, drafter, shared), configs, stores={"heisd": timed, "drafter": None})
    assert list(decs) == ["ar", "drafter", "heisd"] and all(d.vla is vla for d in decs.values())
    assert [d.drafter is drafter for d in decs.values()] == [False, True, True]
    assert [decs[m].store for m in decs] == [shared, None, timed]
    with pytest.raises(ConfigError, match="'heisd' needs a database"):
        assemble_decoders(PolicyParts(vla, drafter=drafter), {"h": DecoderConfig(method="heisd")})


def test_auto_is_the_first_trained_policy_given_else_tiny_and_given_files_win() -> None:
    from heisd_ros.policy import PolicyPaths, choose_auto, is_tiny

    mini, other = PolicyPaths("m", "md", "mdb", "mc"), PolicyPaths("o", "od", "odb", "oc")
    given = PolicyPaths("auto", db_path="mine")
    assert choose_auto(given, [mini, other]) == PolicyPaths("m", "md", "mine", "mc")
    assert is_tiny(choose_auto(given).model_dir) and choose_auto(given).db_path == "mine"
    assert choose_auto(mini, [other]) is mini and not is_tiny("models/tiny")
