"""Hydra schemas for configs that nest frozen option dataclasses (``DecodingOptions``, ``ChunkingConfig``)."""

from __future__ import annotations

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
