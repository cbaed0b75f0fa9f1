"""The public kernels, one module per family. Each validates its inputs, computes the config and
calls the family's dispatcher."""
