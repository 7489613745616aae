"""The master side of a run: ``collector.Collector`` runs it, composed of the run record
(``run_record``), the worker accounts and loss accounting (``accounts``), the stage records
(``stages``), the database writer thread (``writer``), the live figures (``live``), the status
file (``status``) and the ``/metrics`` scraper (``scraper``)."""
