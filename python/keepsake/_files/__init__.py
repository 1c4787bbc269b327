"""Layer 2, tensor files: safetensors' API and the file operations, over keepsake._core.

``torch_files`` and ``numpy_files`` (``save_file`` / ``load_file`` / ``save`` / ``load``),
``model`` (``save_model`` / ``load_model``: shared tensors stored once), ``safe_open`` (lazy,
zero-copy reads), ``pt`` (torch.save files read without unpickling, and written) and ``tools``
(``convert``, ``verify``, ``compute_metrics``: the CLI's operations as functions).
"""
