"""kimi-deploy: a reviewed, reproducible SGLang deployment of moonshotai Kimi K2.x.

The package never imports sglang, torch or flashinfer: SGLang runs in its own
interpreter and is reached through :mod:`kimi_deploy.target`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kimi-deploy")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
