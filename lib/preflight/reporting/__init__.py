"""The report and its charts: findings.json read and checked, the summary page, chapter pages,
offline charts (rendered in a child process), tables and numbers for people, what to fix first,
the before/after comparison."""
