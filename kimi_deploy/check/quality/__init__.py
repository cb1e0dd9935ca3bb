"""The ``quality`` tier of ``kimi-deploy check``: tool-call quality measured the way Moonshot certifies vendors.

Modules: :mod:`.corpus` (the JSON-schema shapes of forced tool calls), :mod:`.schema` (local validation naming the
schema feature a failure involves), :mod:`.stats` (Wilson interval, two-proportion test, verdict),
:mod:`.dataset` (K2VV's JSONL of request bodies; the kit's own samples), :mod:`.accuracy` (N requests, schema
accuracy with its interval), :mod:`.vendor_preflight` (thinking switch, sampling defaults, prompt tokens),
:mod:`.tier` (check ids and dispatch), :mod:`.compare` (``check compare``).
"""
