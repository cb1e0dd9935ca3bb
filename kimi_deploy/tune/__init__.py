"""``kimi-deploy tune``: the best SGLang configuration for this host and this traffic, measured and gated.

- :mod:`.space`: the search space from the options table's tunable rows (:data:`kimi_deploy.options.TUNABLES`),
  ``--space``, and the pruning by the profile rules and the memory plan before any restart;
- :mod:`.search`: which candidate to measure next, a pure function of what was measured (coordinate descent with
  noise-aware acceptance and a finalist round; grid, random and successive halving for the benchmark);
- :mod:`.run`: each candidate through SGLang's parser, ``install``, ``restart --wait --gate --rollback-on-failure``
  and ``bench``; Ctrl-C and the end put the original (or, with ``--apply``, the winner) back, gated;
- :mod:`.journal`: every step persisted atomically, so ``tune --resume`` continues after a kill;
- :mod:`.report`: the table, ``--json``, the Pareto set, the winner's profile diff, the plot, the reproduce commands.

The method and its cost: docs/design.md#tune; the operator's side: docs/runbook.md#tune-a-host.
"""
