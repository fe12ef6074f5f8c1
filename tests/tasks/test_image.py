"""The image task: its accuracy against predictions made by hand from the trained model, export,
and the user's mistakes (one line each)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from cadence import api
from cadence.data.images import read_image_directory
from tests.conftest import make_config, write_images


def test_accuracy_is_the_share_of_test_images_whose_argmax_is_the_label(tmp_path: Path) -> None:
    data = write_images(tmp_path / "images", 240, 60, 7)
    config = make_config(tmp_path / "run", "task=image", f"data.dataset={data}", "image.valid_size=40",
                         "model.name=cnn", "image.channels=[4]", "image.fc=8", "optimizer.dense=sgd",
                         "optimizer.lr=0.05", "optimizer.momentum=0.9")
    result = api.train(config)
    _, task, _, dense = api.load_model(result.run_dir)
    images = read_image_directory(data)
    with torch.no_grad():  # by hand: standardise with the training split's statistics, the layers
        pixels = images.test_images.float() / 255.0
        train = images.train_images[:200].float() / 255.0
        x = ((pixels - train.mean()) / train.std()).unsqueeze(1)
        logits = dense.classifier(dense.features(x))
    expected = float((logits.argmax(1) == images.test_labels).float().mean())
    assert result.summary["accuracy"] == expected
    assert 0.5 < expected  # the bands are easy: a trained model sees them


def test_evaluation_records_no_autograd_graph(tmp_path: Path) -> None:
    """Evaluation runs under no_grad: a graph per evaluation batch was memory and time for nothing
    (and torch warned on every batch's float())."""
    data = write_images(tmp_path / "images", 120, 30, 2)
    config = make_config(tmp_path / "run", "task=image", f"data.dataset={data}", "image.valid_size=20",
                         "image.hidden=[8]", "optimizer.dense=sgd", "train.epochs=1")
    result = api.train(config)
    _, task, _, dense = api.load_model(result.run_dir)
    seen: list[bool] = []
    dense.register_forward_hook(lambda module, args, out: seen.append(out.requires_grad))
    task.evaluate(None, dense, "test", torch.device("cpu"), lambda steps: steps)
    assert seen and not any(seen)


def test_export_writes_each_parameter_and_the_classes(tmp_path: Path) -> None:
    data = write_images(tmp_path / "images", 120, 30, 1)
    config = make_config(tmp_path / "run", "task=image", f"data.dataset={data}", "image.valid_size=20",
                         "image.hidden=[8]", "optimizer.dense=sgd")
    result = api.train(config)
    files = api.export(result.run_dir, tmp_path / "out", "npy")
    names = sorted(p.name for p in files)
    assert "layers.1.weight.npy" in names and "classes.txt" in names and "standardise.mean.npy" in names
    _, _, _, dense = api.load_model(result.run_dir)
    assert np.array_equal(np.load(tmp_path / "out" / "layers.1.weight.npy"), dense.layers[1].weight.detach().numpy())
    assert (tmp_path / "out" / "classes.txt").read_text() == "0\n1\n2\n"


def cadence(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cadence.cli", *args], capture_output=True, text=True, timeout=120)


def test_a_held_out_split_as_large_as_the_data_is_one_line(tmp_path: Path) -> None:
    data = write_images(tmp_path / "images", 50, 10, 1)
    done = cadence("train", "--task", "image", "--dataset", str(data), "--set", "image.valid_size=50",
                   "--out", str(tmp_path / "run"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "cadence: error: --set image.valid_size=50: 50 held-out images leave none of the 50 "
        "training images of images to train on"]
    assert not (tmp_path / "run").exists()


def test_a_broken_image_file_is_one_line_naming_it(tmp_path: Path) -> None:
    data = write_images(tmp_path / "images", 50, 10, 1)
    (data / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8bnot gzip")
    done = cadence("train", "--task", "image", "--dataset", str(data), "--out", str(tmp_path / "run"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"cadence: error: {data / 'train-images-idx3-ubyte.gz'}: not a readable gzip file")
