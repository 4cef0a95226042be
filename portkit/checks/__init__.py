"""Each feature's own validation checks: a module per feature, named by its manifest's
[validation] `checks`, with `run(context) -> (models, checks)`."""
