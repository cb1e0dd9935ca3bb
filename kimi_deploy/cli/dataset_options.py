"""The dataset caps' options of ``check`` and ``bench`` (their own module: it loads :mod:`kimi_deploy.wire.inputs`,
which no other verb needs, so :mod:`kimi_deploy.cli.common` stays free of kit imports for every ``--help``)."""

from __future__ import annotations

import click

from kimi_deploy.cli.common import ByteSize
from kimi_deploy.wire.inputs import BENCH_DATASET_FILE_BYTES, DATASET_FILE_BYTES, DATASET_LINE_BYTES


def dataset_limit_options(streamed: bool):
    """``--max-dataset-line-bytes N`` / ``--max-dataset-bytes N``: the caps of :mod:`kimi_deploy.wire.inputs` on a
    dataset someone else wrote: check's quality tier (``streamed``: the file is read a line at a time) and bench
    (which keeps the prompts it sends, so its file cap is smaller)."""
    def decorate(func):
        func = click.option("--max-dataset-bytes", type=ByteSize(), show_default=True, metavar="N",
                            default=DATASET_FILE_BYTES if streamed else BENCH_DATASET_FILE_BYTES,
                            help="Largest --dataset file read; suffixes K/M/G.")(func)
        func = click.option("--max-dataset-line-bytes", type=ByteSize(), default=DATASET_LINE_BYTES,
                            show_default=True, metavar="N",
                            help="Longest --dataset line read; " + ("a longer one is left out as dataset_invalid"
                                 if streamed else "a longer one is refused") + "; suffixes K/M/G.")(func)
        return func

    return decorate
