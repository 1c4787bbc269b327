"""Layer 6, frameworks: ``lightning`` (Lightning's CheckpointIO, callbacks and strategy over
keepsake files; the public ``keepsake.lightning``), over every layer below.
"""
