"""Live measurements. Each module runs alone (``python -m preflight.bench.NAME --out DIR``) and
writes versioned JSON records (see ``preflight.core.records``) that the audit can ingest with ``--results``."""
