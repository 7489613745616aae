"""The load generator, by role: ``client`` (one streamed HTTP/SSE request, timed and classified;
no Locust), ``worker`` (a load-generating process: run context, open loop, recorder, health),
``master`` (the run: collector, run record, accounts, stages, database writer, live status,
scraper) and the Locust glue (``plugin``, ``users``, ``shapes``, ``options``, ``messages``).

Import ``servelab.loadgen.users`` / ``plugin`` only inside a Locust process: they import locust,
which monkey-patches the process through gevent.
"""
