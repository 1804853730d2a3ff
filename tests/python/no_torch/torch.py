"""A torch that cannot be imported: what `import torch` does on a machine without PyTorch."""
raise ImportError("No module named 'torch' (tests/python/no_torch stands in for a machine without PyTorch)")
