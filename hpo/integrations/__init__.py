"""Collapse-hpo inside the trainers people use: a plain loop (``loop``), Hugging Face (``huggingface``) and
PyTorch Lightning (``lightning``), each with the deviation alarm (``alarm``). Heavy imports (torch,
transformers, lightning) stay inside the modules that need them, never at package import."""
