"""Run real vLLM engines in child processes (inside a loopback-only namespace) and drive them over a pipe."""
