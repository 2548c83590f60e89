"""Named method variants: a decoding method with some DecoderConfig fields changed, reported as a
method of its own by the workbench's `heisd-libero eval-libero` (ablations such as the kinematic
boundary off, or the candidate operating points of a calibration run), and read back by
`heisd choose-point`, which writes the chosen candidate's fields into an operating point.

Spec: `NAME=METHOD[:section.field=value,...]`, several separated by `;`, e.g.
    heisd_tau0=heisd:fused_metric.tau=0;heisd_noskip=heisd:verify_skip.enabled=false
Values are JSON scalars (`0.98`, `6`, `true`, `false`); the result is validated like any
DecoderConfig (an unknown field or an out-of-range value is a ConfigError).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from heisd_ros.core.config import METHODS, DecoderConfig, from_dict, to_dict
from heisd_ros.core.errors import ConfigError


@dataclass(frozen=True)
class MethodVariant:
    """A method label that runs `method` with `overrides` ({dotted DecoderConfig field: value})."""

    name: str
    method: str
    overrides: tuple[tuple[str, object], ...] = ()

    def config(self, base: DecoderConfig) -> DecoderConfig:
        """`base` with this variant's method and overrides (validated)."""
        data = to_dict(base.with_method(self.method))
        for path, value in self.overrides:
            section = data
            *parents, leaf = path.split(".")
            for p in parents:
                if not isinstance(section.get(p), dict):
                    raise ConfigError(f"variant {self.name}: {path!r} is not a DecoderConfig field")
                section = section[p]
            if leaf not in section:
                raise ConfigError(f"variant {self.name}: {path!r} is not a DecoderConfig field")
            section[leaf] = value
        return from_dict(DecoderConfig, data)

    def describe(self) -> str:
        """The spec this variant was parsed from (recorded in the run key and the report)."""
        parts = ",".join(f"{k}={json.dumps(v)}" for k, v in self.overrides)
        return f"{self.name}={self.method}" + (f":{parts}" if parts else "")


def parse_variants(spec: str) -> tuple[MethodVariant, ...]:
    """Variants from a `;`-separated spec (see the module docstring); '' gives none."""
    out: list[MethodVariant] = []
    for item in (s.strip() for s in spec.split(";")):
        if not item:
            continue
        name, sep, rest = item.partition("=")
        method, _, fields = rest.partition(":")
        name, method = name.strip(), method.strip()
        if not sep or not name.isidentifier():
            raise ConfigError(f"variant {item!r}: expected NAME=METHOD[:field=value,...] with NAME an identifier")
        if name in METHODS:
            raise ConfigError(f"variant name {name!r} is a method's own name")
        if method not in METHODS:
            raise ConfigError(f"variant {name}: unknown method {method!r}; choose one of {METHODS}")
        overrides = []
        for assignment in (f.strip() for f in fields.split(",") if f.strip()):
            key, eq, raw = assignment.partition("=")
            if not eq:
                raise ConfigError(f"variant {name}: {assignment!r} is not field=value")
            try:
                value = json.loads(raw.strip())
            except json.JSONDecodeError as err:
                raise ConfigError(f"variant {name}: {raw.strip()!r} is not a JSON value ({err})") from err
            overrides.append((key.strip(), value))
        out.append(MethodVariant(name, method, tuple(overrides)))
    names = [v.name for v in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"variant names must be distinct, got {names}")
    return tuple(out)
