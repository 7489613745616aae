"""The worker side of a run: the run context of one load-generating process (``context``), its
open-loop dispatcher (``openloop``), the spool-then-ship recorder (``recorder``) and the health
monitor (``health``)."""
