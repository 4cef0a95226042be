"""Drift: how each patch of a series fares on other trees, hunk by hunk, and why.

  classify  the series on each target (portkit.follow underneath) -> a DriftReport;
  model     the report, its statuses and its JSON schema;
  formats   the report as table, Markdown, JUnit, SARIF, GitHub annotations, matrix.
"""
