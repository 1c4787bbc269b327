"""Layer 5, torch.distributed, over keepsake._manager and the layers below.

``storage`` (DCP's StorageWriter / StorageReader in keepsake's sharded layout: the public
``keepsake.distributed``), ``manager`` (``DistributedCheckpointManager``: every rank, one sharded
directory per checkpoint), ``local`` (each rank's own items at any world size), ``sync`` (metric
states across ranks, folded by the library's rule) and ``dcp_import`` (DCP directories into
keepsake files: the public ``keepsake.distributed_import``). Importing this package imports no
torch; ``storage`` does.
"""
