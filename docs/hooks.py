"""MkDocs hooks: fill the pages' generated parts from the code, so they cannot drift from it.

``<!-- allreduce:variables -->`` becomes the table of every environment variable
(:mod:`allreduce.cli.variables`); ``<!-- allreduce:cli -->`` becomes the ``--help`` of the command and
of each subcommand.
"""

from __future__ import annotations

import contextlib
import io

from allreduce import cli
from allreduce.cli import variables


def on_page_markdown(markdown: str, **kwargs) -> str:
    """Replace the markers of generated content in a page's markdown."""
    if "<!-- allreduce:variables -->" in markdown:
        markdown = markdown.replace("<!-- allreduce:variables -->", variables.markdown())
    if "<!-- allreduce:cli -->" in markdown:
        markdown = markdown.replace("<!-- allreduce:cli -->", cli_help())
    return markdown


def cli_help() -> str:
    """Markdown with the ``--help`` text of ``allreduce`` and of every subcommand, in a section each."""
    parts = []
    for argv in [[]] + [[name] for name in cli.names()]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            cli.main([*argv, "--help"])
        parts.append(f"## allreduce {' '.join(argv)}\n\n```text\n{out.getvalue().rstrip()}\n```\n")
    return "\n".join(parts)
