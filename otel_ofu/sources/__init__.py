"""Counter sources, each implementing ``otel_ofu.model.Source``."""
