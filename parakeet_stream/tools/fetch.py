"""`python -m parakeet_stream.tools.fetch NAME [--fallback OTHER]`: make sure a model is converted
(scripts/serve.sh runs it before the server starts).

Prints the folder. Exit status 0 when it is ready, 3 when the hub cannot be reached (one line
says so, and that OTHER will be served instead), 1 on any other error.
"""

from __future__ import annotations

import sys

from ..arguments import ArgumentParser
from ..model.errors import ModelNotFound
from ..model.loading import resolve_model_dir

UNREACHABLE = 3


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m parakeet_stream.tools.fetch")
    ap.add_argument("name", help="ORG/NAME[@REVISION], small, large or multilingual")
    ap.add_argument("--fallback", help="named in the message when the hub cannot be reached")
    args = ap.parse_args(argv)
    try:
        print(resolve_model_dir(args.name))  # (a converted weights/NAME folder needs no hub)
    except ModelNotFound as exc:
        if getattr(exc, "unreachable", False):
            instead = f"; serving the {args.fallback} model instead" if args.fallback else ""
            print(f"no network: {exc}{instead}", file=sys.stderr)
            return UNREACHABLE
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
