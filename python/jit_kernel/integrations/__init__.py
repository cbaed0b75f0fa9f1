"""Integrations of jit_kernel's ops into other libraries' models.

- :mod:`jit_kernel.integrations.transformers`: ``apply(model)`` makes a Hugging Face transformers
  model (Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE) run its norms, gated MLP activation and rotary
  embedding on jit_kernel's ops (docs/integrations.md).

Importing this package imports nothing else; each integration imports its library when imported.
"""
