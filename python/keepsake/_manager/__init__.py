"""Layer 4, the checkpoint manager of one process, over keepsake._state.

``options`` (:class:`CheckpointOptions`, the policy, and the components: each field declared
once), ``base`` (what every manager is: the logic the local and the distributed manager share,
``Preempted``), ``local`` (``LocalCheckpointManager``: one file per checkpoint) and ``early``
(``EarlyStopping``). ``keepsake.CheckpointManager`` (the package's ``__init__``) picks this
layer's manager or keepsake._distributed's; neither depends on it.
"""
