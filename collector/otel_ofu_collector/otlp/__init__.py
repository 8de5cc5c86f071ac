"""The OTLP codec: requests in (decode), window outputs out (encode), and shards' partial state between."""
