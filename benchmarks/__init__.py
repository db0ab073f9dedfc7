"""The studies behind docs/: one module or package each (spec <- run <- tables <- __main__), listed
with their commands, outputs and CPU times in benchmarks/README.md."""
