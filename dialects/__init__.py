"""MLIR dialects defined by camlir (mapped into the `camlir` package as `camlir.dialects`)."""
