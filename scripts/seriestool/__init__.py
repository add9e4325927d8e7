"""Tooling for the vLLM weight-loader patch series: base, apply, export, audit, rebase."""
