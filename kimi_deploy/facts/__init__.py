"""Facts of this host that more than one verb reads, each a command builder or a file reader plus a pure
parser tested on recorded output: the GPUs and their topology (:mod:`.nvidia`: ``nvidia-smi``), a model
directory's shards and safetensors headers (:mod:`.modeldir`), the host's memory (:mod:`.meminfo`: what
``doctor`` and the weights prefetch read of ``/proc/meminfo``), free disk where a path is (:mod:`.disk`), whether
a server can listen on a port here (:mod:`.ports`) and systemd's state of a unit (:mod:`.units`: ``systemctl show``,
``is-enabled``, ``is-active``, which ``status``, ``restart --wait`` and ``install`` read; the one ``systemctl``
gateway), and the accounts and ``/dev/nvidia*`` device groups ``install`` plans the service user from
(:mod:`.accounts`). ``doctor`` judges them and the memory plan
(:mod:`kimi_deploy.sizing`) sizes with them; neither imports the other's package for them.
"""
