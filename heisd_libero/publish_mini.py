"""`heisd-libero publish-mini`: a compact, committed copy of the mini LIBERO policy.

Usage:
    heisd-libero publish-mini [--model artifacts/mini_vla] [--drafter artifacts/mini_drafter]
                       [--calibration artifacts/mini_calibration.json] [--out models/mini_libero]
    heisd-libero publish-mini --calibration-only --calibration artifacts/eval_object/calibration.json

The pipeline's artifacts are git-ignored and take about an hour to rebuild (scripts/mini_pipeline.sh).
This writes what a fresh clone needs to run the mini policy, small enough to commit:
- `vla/`: the VLA in the on-disk form `load_vla` reads, weights rounded to bfloat16 (about half
  the size; the node loads them into its configured dtype), with its train_log.json and, for a
  model with a state prior (`heisd train-prior`), the prior and its log;
- `drafter/`: the drafter, bfloat16 likewise;
- `calibration.json`: the operating point, every decoder setting it was measured with (unchanged);
- `manifest.json`: where each part came from (paths, sha256 digests, the git revision).

`--calibration-only` replaces the calibration of a published copy and nothing else (the operating
point `heisd choose-point` picked in closed loop, docs/eval_libero.md): the weights stay the bytes
they are, and the manifest gains the new file's digest, its source and the command and revision
that wrote it (`calibration_update`).

The database is not published (hundreds of MB): `heisd demo` rebuilds a one-task database from
freshly generated demonstrations (docs/mini_vla.md, "The demo on a fresh clone").
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.libero_runs import PUBLISHED_DIR, published_paths, published_present


@dataclass(frozen=True)
class PublishConfig:
    model: str = "artifacts/mini_vla"
    drafter: str = "artifacts/mini_drafter"
    calibration: str = "artifacts/mini_calibration.json"
    out: str = PUBLISHED_DIR


def _check_calibration(path: Path) -> None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"calibration {path} unreadable: {err}") from err
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.pipeline.calibration import POINT_VERSION, apply_point, point_settings

    # what ships is the whole point it was measured at: every setting, in a file the node applies
    missing = sorted(set(point_settings(DecoderConfig())) - set(data)) if isinstance(data, dict) else ["all"]
    if missing or data.get("version") != POINT_VERSION:
        raise ConfigError(f"calibration {path} is not a complete operating point (version {POINT_VERSION}; "
                          f"missing {missing}): write it with heisd calibrate or heisd choose-point")
    apply_point(DecoderConfig(), data)  # refuses a value the decoder would refuse


def publish(cfg: PublishConfig) -> dict:
    import torch

    from heisd_ros.core.drafter import load_drafter
    from heisd_ros.models.loader import load_policy_model, require_heisd_vla
    from heisd_ros.pipeline.outputs import git_revision, hash_file

    _check_calibration(Path(cfg.calibration))  # refuse a broken file before writing anything
    require_heisd_vla(cfg.model, "heisd-libero publish-mini")
    out = Path(cfg.out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    paths = published_paths(tmp)
    vla, prior = load_policy_model(cfg.model, dtype="bfloat16")
    vla.save_pretrained(paths["model_dir"])
    if prior is not None:
        prior.save(paths["model_dir"])
    for name in ("train_log.json", "state_prior_log.json"):
        if (Path(cfg.model) / name).is_file():
            shutil.copy2(Path(cfg.model) / name, paths["model_dir"] / name)
    drafter = load_drafter(cfg.drafter, vla.language_model.config, torch.bfloat16)
    drafter.save(paths["drafter_dir"])
    shutil.copy2(cfg.calibration, paths["calibration_path"])
    sources = {"model": cfg.model, "drafter": cfg.drafter, "calibration": cfg.calibration}
    manifest = {
        "command": "heisd-libero publish-mini " + " ".join(f"--{k} {v}" for k, v in {**sources, "out": cfg.out}.items()),
        "git_revision": git_revision(),
        "weights_dtype": "bfloat16",
        "sources": {
            "model_safetensors_sha256": hash_file(Path(cfg.model) / "model.safetensors").hexdigest(),
            "drafter_safetensors_sha256": hash_file(Path(cfg.drafter) / "drafter.safetensors").hexdigest(),
            "calibration_sha256": hash_file(cfg.calibration).hexdigest(),
        },
        "files": {str(p.relative_to(tmp)): hash_file(p).hexdigest() for p in sorted(tmp.rglob("*")) if p.is_file()},
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return manifest


def publish_calibration(calibration: str, out: str = PUBLISHED_DIR) -> dict:
    """Replace the calibration of the published copy at `out` and record it in its manifest."""
    from heisd_ros.pipeline.outputs import git_revision, hash_file, write_json

    _check_calibration(Path(calibration))
    root = Path(out)
    manifest_path = root / "manifest.json"
    if not published_present(root) or not manifest_path.is_file():
        raise ConfigError(f"{out} holds no published copy (heisd-libero publish-mini writes one)")
    manifest = json.loads(manifest_path.read_text())
    target = published_paths(root)["calibration_path"]
    tmp = target.with_name(target.name + ".tmp")
    shutil.copy2(calibration, tmp)
    tmp.replace(target)
    digest = hash_file(target).hexdigest()
    manifest["files"]["calibration.json"] = digest
    manifest["sources"]["calibration_sha256"] = digest
    manifest["calibration_update"] = {
        "command": f"heisd-libero publish-mini --calibration-only --calibration {calibration} --out {out}",
        "git_revision": git_revision(), "calibration": calibration}
    write_json(manifest_path, manifest)
    return manifest


def main(argv: list[str] | None = None) -> int:
    d = PublishConfig()
    p = argparse.ArgumentParser(prog="heisd-libero publish-mini", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("model", "drafter", "calibration", "out"):
        p.add_argument(f"--{name}", default=getattr(d, name))
    p.add_argument("--calibration-only", action="store_true",
                   help="replace only the calibration of the published copy at --out (weights untouched)")
    args = vars(p.parse_args(argv))
    calibration_only = args.pop("calibration_only")
    cfg = PublishConfig(**args)
    if calibration_only:
        try:
            publish_calibration(cfg.calibration, cfg.out)
        except (ConfigError, OSError, json.JSONDecodeError) as err:
            print(f"heisd-libero publish-mini: {err}", file=sys.stderr)
            return 2
        print(f"publish-mini: calibration {cfg.calibration} -> {cfg.out}/calibration.json")
        return 0
    manifest = publish(cfg)
    size = sum(f.stat().st_size for f in Path(cfg.out).rglob("*") if f.is_file())
    print(f"publish-mini: {len(manifest['files'])} files, {size / 1e6:.1f} MB -> {cfg.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
