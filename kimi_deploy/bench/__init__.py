"""``kimi-deploy bench``: a serving benchmark whose metrics survive speculative decoding.

Modules, one concern each: :mod:`.metrics` (definitions and arithmetic on event timelines),
:mod:`.client` (the connection pool and SSE framing), :mod:`.loadgen` (closed/open-loop load and
the sweep), :mod:`.prompts` (prompts), :mod:`.report` (result JSON/CSV, terminal table),
:mod:`.compare` (ratios table and PNG plot).
"""
