"""The flags every KGE peer contender takes (``pbg_contender.py``, ``torchkge_contender.py``): the
setting ``kge_vs_pbg.py`` hands each. Plain argparse: the contenders run in their own virtualenvs and
never import cadence."""

from __future__ import annotations

import argparse
from pathlib import Path


def kge_contender_parser(description: str) -> argparse.ArgumentParser:
    """--data, --out and the shared setting (dim, negatives, batch size, learning rate, epochs); each
    contender adds its own flags."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--negatives", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=1)
    return parser
