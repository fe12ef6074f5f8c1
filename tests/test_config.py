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
