"""Argument checks shared by the subcommands, so that a mistake is reported before any work starts."""

from __future__ import annotations

import argparse
import importlib.util
import os


def output_file(text: str) -> str:
    """An argparse ``type`` for a file to write at the end: its folder must exist now, not after the run."""
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: there is no folder {folder!r}; create it first")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: the folder {folder!r} is not writable")
    return text


def plot_file(text: str) -> str:
    """An argparse ``type`` for a PNG to draw at the end: :func:`output_file`, and matplotlib installed."""
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError("plots need matplotlib: pip install matplotlib (or 'allreduce[bench]')")
    return output_file(text)


def dtype_name(choices: list[str]):
    """An argparse ``type`` for a dtype name among ``choices``; bfloat16 without ml_dtypes says what to install."""

    def parse(text: str) -> str:
        if text in choices:
            return text
        if text == "bfloat16":
            raise argparse.ArgumentTypeError("bfloat16 needs ml_dtypes: pip install ml_dtypes (or 'allreduce[bf16]')")
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; use one of {', '.join(choices)}")

    return parse
