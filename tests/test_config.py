from pathlib import Path

import pytest

from cadence.config import Config, from_dict, load_config
from cadence.errors import ConfigError


def test_defaults_round_trip_through_yaml(tmp_path: Path) -> None:
    config = load_config(None, ["train.epochs=3", "model.name=distmult", "optimizer.dense_lr=0.5"])
    path = tmp_path / "config.yaml"
    path.write_text(config.to_yaml())
    assert load_config(path) == config
    assert config.train.epochs == 3 and config.optimizer.dense_lr == 0.5


def test_unknown_key_names_the_key_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("seed: 1\ntrain:\n  epochs: 3\n  epoch: 4\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:4: unknown key 'train.epoch' \(did you mean 'train.epochs'\?\)"):
        load_config(path)


def test_wrong_type_names_the_key() -> None:
    with pytest.raises(ConfigError, match="train.epochs must be of type int"):
        load_config(None, ["train.epochs=many"])
    with pytest.raises(ConfigError, match="train.epochs must be of type int"):
        from_dict({"train": {"epochs": True}})


def test_choice_and_range_errors() -> None:
    with pytest.raises(ConfigError, match="train.loss must be one of softmax, logistic"):
        load_config(None, ["train.loss=hinge"])
    with pytest.raises(ConfigError, match="model.dim must be positive"):
        load_config(None, ["model.dim=0"])
    with pytest.raises(ConfigError, match="override 'epochs' is not of the form key=value"):
        load_config(None, ["epochs"])


def test_float_accepts_int_and_optional_accepts_null() -> None:
    config = load_config(None, ["optimizer.lr=1", "optimizer.dense_lr=null"])
    assert config.optimizer.lr == 1.0 and isinstance(config.optimizer.lr, float)
    assert config.optimizer.dense_lr is None


def test_invalid_yaml_reports_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("seed: 1\ntrain: [epochs\n")
    with pytest.raises(ConfigError, match="broken.yaml:3: invalid YAML"):
        load_config(path)


def test_exponent_floats_are_numbers_in_files_and_overrides(tmp_path: Path) -> None:
    """YAML 1.1 reads ``1e-5`` as a string; a config means the number (as YAML 1.2, JSON, Python)."""
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text("optimizer:\n  lr: 1e-5\n  dense_lr: 2.5E+2\nseed: 12\n")
    config = load_config(path)
    assert config.optimizer.lr == 1e-5 and config.optimizer.dense_lr == 250.0 and config.seed == 12
    assert load_config(None, ["optimizer.lr=3e-4"]).optimizer.lr == 3e-4
    assert yaml.safe_load("x: 1e-5")["x"] == "1e-5", "the stock SafeLoader must stay as it was"


def test_a_key_given_twice_is_an_error_naming_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("train:\n  epochs: 1\nseed: 3\ntrain:\n  epochs: 2\n")
    with pytest.raises(ConfigError, match=r"dup.yaml:4: invalid YAML: duplicate key 'train' \(first on line 1\)"):
        load_config(path)
    path.write_text("train:\n  epochs: 1\n  epochs: 2\n")
    with pytest.raises(ConfigError, match=r"dup.yaml:3: .*duplicate key 'epochs' \(first on line 2\)"):
        load_config(path)


def test_typed_values_are_set_as_they_are_and_named_as_typed() -> None:
    config = load_config(None, ["out=ignored"], values=[("out", "2025", "--out 2025"), ("optimizer.lr", 1e-5, "--lr 1e-05")])
    assert config.out == "2025" and config.optimizer.lr == 1e-5
    with pytest.raises(ConfigError, match=r"^--epochs 0: train.epochs must be positive"):
        load_config(None, values=[("train.epochs", 0, "--epochs 0")])


@pytest.mark.parametrize("item", ["optimizer.lr=.nan", "optimizer.lr=.inf", "model.init_std=-.inf",
                                  "pipeline.stall_timeout=.inf", "optimizer.dense_lr=.nan", "data.synthetic.exponent=.nan"])
def test_nan_and_infinities_are_rejected(item: str, tmp_path: Path) -> None:
    key = item.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key} must be a finite number"):
        load_config(None, [item])
    path = tmp_path / "c.yaml"  # the same from a file, naming its line
    section, name = key.rsplit(".", 1)
    text = "".join(f"{'  ' * depth}{part}:\n" for depth, part in enumerate(section.split(".")))
    path.write_text(f"seed: 1\n{text}{'  ' * len(section.split('.'))}{name}: {item.split('=')[1]}\n")
    with pytest.raises(ConfigError, match=rf"c.yaml:\d+: {key} must be a finite number"):
        load_config(path)


def test_shipped_configs_load() -> None:
    configs = sorted(Path(__file__).parents[1].joinpath("configs").glob("*.yaml"))
    assert configs, "the repository ships experiment configs"
    for path in configs:
        assert isinstance(load_config(path), Config)


@pytest.mark.parametrize("task, model, optimizer", [("kge", "complex", "rowwise_adagrad"), ("ctr", "deepfm", "rowwise_adagrad"),
                                                    ("mf", "biased", "adagrad"), ("w2v", "skipgram", "sgd")])
def test_each_task_resolves_its_default_model_and_optimizer(task: str, model: str, optimizer: str) -> None:
    from cadence.api import prepare_config

    config = prepare_config(load_config(None, [f"task={task}"]))
    assert (config.model.name, config.optimizer.entity) == (model, optimizer)
    explicit = prepare_config(load_config(None, [f"task={task}", "optimizer.entity=adagrad"]))
    assert explicit.optimizer.entity == "adagrad"
