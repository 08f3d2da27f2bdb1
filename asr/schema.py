"""Hydra schemas for configs that nest frozen option dataclasses (``DecodingOptions``, ``ChunkingConfig``)."""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf


def writable_schema(config_class: type) -> DictConfig:
    """The structured config of ``config_class`` with every node writable.

    NOTE: OmegaConf marks frozen dataclasses read-only, so Hydra could not merge YAML or command-line values
    into them; the types (and so the typo checks) stay, and ``OmegaConf.to_object`` still builds the frozen
    instances.
    """
    node = OmegaConf.structured(config_class)
    _clear_readonly(node)
    return node


def _clear_readonly(node: DictConfig) -> None:
    OmegaConf.set_readonly(node, None)  # None = inherit (the root is writable)
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            _clear_readonly(child)


CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def register_yaml_group(group: str, conf_dir: Path = CONF_DIR) -> None:
    """Store every ``conf_dir/<group>/*.yaml`` in Hydra's ConfigStore under ``group``.

    NOTE: entry points whose ``config_path`` is a subfolder (so that ``model=PATH`` is a plain value, not the
    training's ``model`` config group) still select ``<group>=NAME`` from the one set of YAML presets.
    """
    store = ConfigStore.instance()
    for path in sorted((conf_dir / group).glob("*.yaml")):
        store.store(group=group, name=path.stem, node=OmegaConf.load(path))
