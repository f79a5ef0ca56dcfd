"""Live measurements. Each module runs alone (``python -m preflight.bench.NAME --out DIR``) and
writes versioned JSON records (see ``preflight.records``) that the audit can ingest with ``--results``."""


def exit_worker(main) -> None:
    """Run a torchrun worker's ``main()`` and end the process with ``os._exit``.

    By then the record is written and every rank has passed the barrier and destroyed the process
    group. A normal interpreter exit still aborted in about 1 run in 40 on gloo (2 cores, torch 2.13:
    "terminate called without an active exception", in C++ teardown after the last Python frame),
    and torchrun then failed a finished run; with ``os._exit``, 0 in 80. (``main()`` itself returns
    normally, for callers in-process.)"""
    import os
    import sys

    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
