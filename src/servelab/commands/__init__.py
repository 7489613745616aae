"""One module per command family. Each exposes ``register(subparsers)``; heavy imports (locust,
which monkey-patches the process through gevent; aiohttp; matplotlib) happen inside the handlers,
so ``servelab --help`` stays fast and one command never drags in another's runtime."""
from __future__ import annotations

import sys


def call(args) -> int:
    """Run a parsed command's handler the way the console script does: a ``ServelabError`` is
    printed as ``servelab COMMAND: message`` with exit status 2 (no traceback: it is the
    user's input), Ctrl-C exits 130. ``servelab``, ``python -m servelab.commands.sim`` and
    ``servelab demo`` (which runs ``servelab matrix``) share it."""
    from servelab.core.errors import ServelabError

    try:
        return int(args.func(args) or 0)
    except ServelabError as exc:
        print(f"servelab {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
