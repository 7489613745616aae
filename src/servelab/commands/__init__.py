"""One module per command family. Each exposes ``register(subparsers)``; heavy imports (locust,
which monkey-patches the process through gevent; aiohttp; matplotlib) happen inside the handlers,
so ``servelab --help`` stays fast and one command never drags in another's runtime."""
