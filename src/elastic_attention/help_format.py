"""How every `--help` of the command line reads: the command's own name, each option's default, and an example.

Light on purpose (argparse alone): `elastic-attention <command> --help` imports no torch.
"""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, but a description or epilog written over several lines keeps its lines (an example
    command stays one block), and an option's help ends with its default unless it says its default itself."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or not shows_default(action):
            return text
        return f"{text} (default: %(default)s)"


def finish_parser(parser: argparse.ArgumentParser, example: str) -> argparse.ArgumentParser:
    """Give ``parser`` the `HelpFormatter`, an ``example:`` epilog with ``example`` (one command, or several lines;
    kept where the epilog already gives one) and a help text to each option that has a default but no help (argparse
    prints no default for an option without help)."""
    parser.formatter_class = HelpFormatter
    if "example" not in (parser.epilog or ""):
        parser.epilog = "\n".join(filter(None, [parser.epilog, "example:",
                                                *("  " + line for line in example.splitlines())]))
    for action in parser._actions:
        if action.help is None and shows_default(action):
            action.help = "(default: %(default)s)"
    return parser


def shows_default(action: argparse.Action) -> bool:
    """Whether ``action`` is an option with a default worth printing (not None, a flag's False or suppressed; 0 is
    one, hence no ``in`` test, where 0 == False)."""
    return bool(action.option_strings) and not any(action.default is nothing
                                                   for nothing in (None, False, argparse.SUPPRESS))
