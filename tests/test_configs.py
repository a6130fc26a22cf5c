"""Every file under configs/ loads into its dataclass (no unknown keys, valid values), and the loader
rejects unknown keys, wrong types and bad values naming the file and key."""

from pathlib import Path

import pytest

from marsrl.commands.compare import CompareConfig
from marsrl.commands.demo import DemoConfig
from marsrl.config import ConfigError, load_config

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
# filename prefix -> the dataclass its YAML overrides; a new kind of config must be registered here
KINDS = {"demo": DemoConfig, "rollouts": CompareConfig}
FILES = sorted(CONFIG_DIR.glob("*.yaml"))


def test_there_are_configs():
    assert FILES, "configs/ is empty"


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_config_loads(path):
    kind = next((k for k in KINDS if path.name.startswith(k)), None)
    assert kind is not None, f"{path.name}: no dataclass registered for this config (tests/test_configs.py)"
    cfg = load_config(KINDS[kind], path)
    assert isinstance(cfg, KINDS[kind])
    first = path.read_text().splitlines()[:3]
    assert any("Launch:" in line for line in first), f"{path.name}: header must give the launch command"


def test_unknown_key_names_file_and_key(tmp_path):
    bad = tmp_path / "demo_bad.yaml"
    bad.write_text("thetaa: 0.8\n")
    with pytest.raises(ConfigError, match=r"demo_bad\.yaml.*thetaa"):
        load_config(DemoConfig, bad)


def test_wrong_type_and_bad_value(tmp_path):
    with pytest.raises(ConfigError, match="rounds"):
        load_config(DemoConfig, None, ["rounds=many"])
    with pytest.raises(ConfigError, match="theta"):
        load_config(DemoConfig, None, ["theta=-1"])
    with pytest.raises(ConfigError, match="rules"):
        load_config(DemoConfig, None, ["rules=[strict, lenient]"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(DemoConfig, tmp_path / "missing.yaml")


def test_overrides_win_over_file(tmp_path):
    f = tmp_path / "demo.yaml"
    f.write_text("theta: 0.8\nrounds: 10\n")
    cfg = load_config(DemoConfig, f, ["theta=0.95", "temperature=0"])
    assert (cfg.theta, cfg.rounds, cfg.temperature) == (0.95, 10, 0.0)
    assert load_config(DemoConfig).theta == DemoConfig().theta  # defaults live in the dataclass only
