"""In-package fakes that serve the tests, the demo and the benchmarks alike."""
