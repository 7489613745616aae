"""The HTTP/SSE client: one streamed LLM request over a geventhttpclient connection pool, timed
and classified (``request.execute``), with the wire format (``wire``), the stream reader
(``stream``), the timeouts (``watchdog``) and the clock (``clock``). No Locust import: Locust's
own bookkeeping is the caller's (``loadgen.users.report_request``)."""
