"""kimi-deploy: a reviewed, reproducible SGLang deployment of moonshotai Kimi K2.x.

The package never imports sglang, torch or flashinfer: SGLang runs in its own
interpreter and is reached through :mod:`kimi_deploy.engine`.

``__version__`` is looked up on first use (``importlib.metadata`` costs about 30 ms
of start-up, which ``kimi-deploy --help`` need not pay).
"""

from typing import Any

__all__ = ["__version__"]


def __getattr__(name: str) -> Any:
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("kimi-deploy")
    except PackageNotFoundError:  # running from a source tree without installing
        value = "0.0.0+source"
    globals()["__version__"] = value
    return value
