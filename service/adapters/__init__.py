"""Adapters: each holds one library client by composition and turns its errors into ours."""
