"""The command-line tools' parser: a mistake in the arguments is one line (argparse's usage above it
buried the reason) that points at --help."""
from __future__ import annotations

import argparse


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")
