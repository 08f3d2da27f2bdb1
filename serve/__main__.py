"""python -m serve model=BUNDLE host=127.0.0.1 port=8000 [max_batch_size=16 decoding.strategy=beam ...]"""

from __future__ import annotations

import hydra
import uvicorn
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from asr.schema import register_yaml_group, writable_schema
from serve.app import create_app
from serve.config import ServeConfig


def register_configs() -> None:
    """The CLI's Hydra schema and the decoding presets."""
    ConfigStore.instance().store(name="serve_schema", node=writable_schema(ServeConfig))
    register_yaml_group("decoding")


@hydra.main(version_base=None, config_path="../conf/serve", config_name="serve")
def main(cfg) -> None:
    """Load the model once and serve it with uvicorn until interrupted."""
    config: ServeConfig = OmegaConf.to_object(cfg)
    app = create_app(config)
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level)


if __name__ == "__main__":
    register_configs()
    main()
