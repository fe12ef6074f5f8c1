"""The flags every CTR peer contender takes (``deepctr_contender.py``, ``torchrec_contender.py``):
the setting ``ctr_vs_deepctr.py`` hands each, so one command line drives either. Plain argparse:
the contenders run in their own virtualenvs and never import cadence."""

from __future__ import annotations

import argparse
from pathlib import Path


def ctr_contender_parser(description: str, optimizers: tuple[str, ...], default_optimizer: str,
                         optimizer_help: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", required=True, type=Path, help="directory written by ctr_split_export.py")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--hidden", default="64,32", help="comma-separated MLP widths")
    parser.add_argument("--dropout", type=float, default=0.0, help="MLP dropout (the config: 0.2)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--optimizer", choices=optimizers, default=default_optimizer, help=optimizer_help)
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate (cadence: of the embedding rows)")
    parser.add_argument("--dense-lr", type=float, default=0.001, help="Adam lr of the dense part (--optimizer cadence)")
    parser.add_argument("--init-std", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the result here")
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The flags, ``--hidden`` as a list of widths."""
    args = parser.parse_args(argv)
    args.hidden = [int(width) for width in args.hidden.split(",") if width.strip()]
    return args


def report(args: argparse.Namespace, result: dict) -> int:
    """Print the contender's result as one JSON line (its settings added: the flags as given), and
    write it to ``--json`` too when given."""
    import json

    result["settings"] = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
    text = json.dumps(result)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0
