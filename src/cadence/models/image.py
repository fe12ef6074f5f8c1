"""Image classifiers (``task: image``): an MLP and a small CNN, both taking raw ``uint8`` images.

The pixels are scaled to [0, 1] and standardised with the training images' mean and standard
deviation (buffers of the module, so a checkpoint carries them), then:

- ``mlp``: flatten, ``image.hidden`` fully connected ReLU layers, a linear layer to the classes
  (Fashion-MNIST's README benchmarks an MLP of this kind at 0.87-0.88 test accuracy);
- ``cnn``: per ``image.channels`` entry a 3x3 convolution (padding 1), ReLU and 2x2 max-pooling,
  then ``image.fc`` fully connected ReLU units and a linear layer to the classes (two blocks of 32
  and 64 channels: the README's "2 Conv + pooling" row, 0.91-0.92).

No batch normalisation: its running statistics are buffers that threads updating the shared weights
(Hogwild, pdASGD) would race on, and that a parameter server would have to carry beside gradients.
"""

from __future__ import annotations

from torch import Tensor, nn

from cadence.errors import ConfigError
from cadence.models.layers import Dropout
from cadence.registry import Registry

IMAGE_MODELS: Registry[type[nn.Module]] = Registry("image model", "model.name")


class _Standardise(nn.Module):
    def __init__(self, mean: float, std: float):
        super().__init__()
        self.register_buffer("mean", Tensor([mean]))
        self.register_buffer("std", Tensor([std]))

    def forward(self, images: Tensor) -> Tensor:
        return (images.float().div(255.0) - self.mean) / self.std


def _hidden(widths: list[int], inputs: int, dropout: float) -> tuple[list[nn.Module], int]:
    layers: list[nn.Module] = []
    for width in widths:
        layers += [nn.Linear(inputs, width), nn.ReLU()]
        if dropout:
            layers.append(Dropout(dropout))
        inputs = width
    return layers, inputs


@IMAGE_MODELS.register("mlp")
class Mlp(nn.Module):
    reads = ("image.hidden",)  # the config keys this model alone reads (another model's: an error)
    def __init__(self, shape: tuple[int, int], classes: int, mean: float, std: float, config) -> None:
        super().__init__()
        self.standardise = _Standardise(mean, std)
        layers, width = _hidden(list(config.hidden), shape[0] * shape[1], config.dropout)
        self.layers = nn.Sequential(nn.Flatten(), *layers, nn.Linear(width, classes))

    def forward(self, images: Tensor) -> Tensor:
        return self.layers(self.standardise(images))


@IMAGE_MODELS.register("cnn")
class Cnn(nn.Module):
    reads = ("image.channels", "image.fc")
    def __init__(self, shape: tuple[int, int], classes: int, mean: float, std: float, config) -> None:
        super().__init__()
        self.standardise = _Standardise(mean, std)
        blocks: list[nn.Module] = []
        channels, (height, width) = 1, shape
        for out in config.channels:
            blocks += [nn.Conv2d(channels, out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            channels, height, width = out, height // 2, width // 2
        if height < 1 or width < 1:
            raise ConfigError(f"image.channels: {len(config.channels)} pooling blocks shrink {shape[0]}x{shape[1]} "
                              "images to nothing; use fewer")
        self.features = nn.Sequential(*blocks)
        layers, size = _hidden([config.fc], channels * height * width, config.dropout)
        self.classifier = nn.Sequential(nn.Flatten(), *layers, nn.Linear(size, classes))

    def forward(self, images: Tensor) -> Tensor:
        return self.classifier(self.features(self.standardise(images).unsqueeze(1)))
