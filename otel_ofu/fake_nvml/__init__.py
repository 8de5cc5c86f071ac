"""C source of the fake NVML library (``fake_nvml.c``); built and driven by ``otel_ofu.testing.fake_nvml``."""
