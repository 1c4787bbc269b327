"""Layer 3, a training run's state in one file, over keepsake._core.

``checkpoint`` (``save_checkpoint`` / ``load_checkpoint``: the key layout and the components),
``load`` (the program's objects described to the C load engine, and what it staged installed),
``metrics`` (any torchmetrics metric's states, saved by name), ``rng`` (the generators) and
``staging`` (page-locked host staging of CUDA tensors, reused from save to save).
"""
